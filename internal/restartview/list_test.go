package restartview

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/wire"
)

// listEngine decides about the instances in held, but for those in quiet
// when running, and the containers of the sandboxes in restarting: hides
// those named in hide, shows those in fake running. It records what
// Verdicts was given.
type listEngine struct {
	engine
	held, quiet []string
	restarting  []string
	hide, fake map[string]bool
	given      []wire.Container
}

func (e *listEngine) Interest(restarting []string) (_, _ *wire.HeadSet, _ []string) {
	set := func(ids []string) *wire.HeadSet {
		var heads []uint64
		for _, id := range ids {
			heads = append(heads, wire.IDHead([]byte(id)))
		}
		return wire.NewHeadSet(heads)
	}
	return set(e.held), set(e.quiet), append(restarting, e.restarting...)
}

func (e *listEngine) Verdicts(_ context.Context, cs []wire.Container, _ *runtimeapi.ContainerStateValue) ([]wire.Verdict, error) {
	e.given = append(e.given, cs...)
	out := make([]wire.Verdict, len(cs))
	for i, c := range cs {
		out[i] = wire.Verdict{Hide: e.hide[c.ID], Fake: e.fake[c.ID]}
	}
	return out, nil
}

// The view hands Verdicts only the containers the engine may decide
// about (held instances, or every container of a restarting pod), read as
// proto reads them, and applies each verdict to its own entry; a list
// with nothing to change is the runtime's own bytes.
func TestListHandsVerdictsOnlyWhatTheEngineMayDecide(t *testing.T) {
	entry := func(id, sb string, st runtimeapi.ContainerState) *runtimeapi.Container {
		return &runtimeapi.Container{Id: id, PodSandboxId: sb, Metadata: &runtimeapi.ContainerMetadata{Name: "n-" + id}, State: st,
			Labels: map[string]string{"io.kubernetes.pod.name": sb}}
	}
	list := []*runtimeapi.Container{
		entry("a", "other", runtimeapi.ContainerState_CONTAINER_EXITED),
		entry("b", "mine", runtimeapi.ContainerState_CONTAINER_RUNNING),
		entry("c", "other", runtimeapi.ContainerState_CONTAINER_RUNNING),
		entry("d", "mine", runtimeapi.ContainerState_CONTAINER_EXITED),
		entry("e", "mine", runtimeapi.ContainerState_CONTAINER_CREATED),
		entry("f", "other", runtimeapi.ContainerState_CONTAINER_EXITED),
	}
	resp, err := proto.Marshal(&runtimeapi.ListContainersResponse{Containers: list})
	if err != nil {
		t.Fatal(err)
	}
	next := func(context.Context, []byte) ([]byte, error) { return resp, nil }
	type testCase struct {
		name                    string
		held, quiet, restarting []string
		given                   []string // handed to Verdicts
		hide, fake              []string
		want                    []string // IDs listed; faked ones shown running
	}
	var cases []testCase
	for _, interest := range []testCase{
		{name: "held", held: []string{"b", "d", "e"}, given: []string{"b", "d", "e"}},
		{name: "restarting", restarting: []string{"mine"}, given: []string{"b", "d", "e"}},
		{name: "held and restarting", held: []string{"d"}, restarting: []string{"gone", "mine"}, given: []string{"b", "d", "e"}},
		// b runs: left out; d has exited: handed on although quiet.
		{name: "quiet", held: []string{"b", "d", "e"}, quiet: []string{"b", "d"}, given: []string{"d", "e"}},
		{name: "quiet but restarting", held: []string{"b", "d", "e"}, quiet: []string{"b", "d"}, restarting: []string{"mine"}, given: []string{"b", "d", "e"}},
	} {
		for _, tc := range []testCase{
			{name: "nothing to change", want: []string{"a", "b", "c", "d", "e", "f"}},
			{name: "hide and fake", hide: []string{"e"}, fake: []string{"d"}, want: []string{"a", "b", "c", "d", "f"}},
			{name: "hide the first of theirs", hide: []string{"b"}, want: []string{"a", "c", "d", "e", "f"}},
		} {
			if slices.ContainsFunc(append(tc.hide, tc.fake...), func(id string) bool { return !slices.Contains(interest.given, id) }) {
				continue // a verdict Verdicts is not asked for
			}
			tc.name, tc.held, tc.quiet, tc.restarting, tc.given = interest.name+"/"+tc.name, interest.held, interest.quiet, interest.restarting, interest.given
			cases = append(cases, tc)
		}
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := &listEngine{engine: engine{tracked: map[string]bool{"x": true}}, held: tc.held, quiet: tc.quiet, restarting: tc.restarting,
				hide: map[string]bool{}, fake: map[string]bool{}}
			for _, id := range tc.hide {
				e.hide[id] = true
			}
			for _, id := range tc.fake {
				e.fake[id] = true
			}
			v := New(e, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
			out, err := v.ListContainersBytes(context.Background(), nil, next)
			if err != nil {
				t.Fatal(err)
			}
			var given []string
			for _, c := range e.given {
				if c.Sandbox != "mine" || c.Name != "n-"+c.ID {
					t.Fatalf("Verdicts got %+v", c)
				}
				given = append(given, c.ID)
			}
			if !slices.Equal(given, tc.given) {
				t.Fatalf("Verdicts got %v, want %v", given, tc.given)
			}
			if len(tc.hide)+len(tc.fake) == 0 && &out[0] != &resp[0] {
				t.Fatal("a list with nothing to change is not the runtime's own bytes")
			}
			// The same answer cut in frames of 7 bytes: entries across frames.
			var frames [][]byte
			for rest := resp; len(rest) > 0; {
				k := min(len(rest), 7)
				frames, rest = append(frames, rest[:k]), rest[k:]
			}
			e.given = nil
			fout, asIs, err := v.ListContainersFrames(context.Background(), nil, func(context.Context, []byte) ([][]byte, error) { return frames, nil })
			if err != nil || asIs != (len(tc.hide)+len(tc.fake) == 0) || !asIs && !bytes.Equal(fout, out) || len(e.given) != len(tc.given) {
				t.Fatalf("in frames: %d bytes, as is %v, %v, %d given; in one buffer %d bytes", len(fout), asIs, err, len(e.given), len(out))
			}
			var got runtimeapi.ListContainersResponse
			if err := proto.Unmarshal(out, &got); err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, c := range got.Containers {
				ids = append(ids, c.Id)
				if wantState := list[c.Id[0]-'a'].State; e.fake[c.Id] && c.State != runtimeapi.ContainerState_CONTAINER_RUNNING ||
					!e.fake[c.Id] && c.State != wantState {
					t.Fatalf("%s listed %v", c.Id, c.State)
				}
			}
			if !slices.Equal(ids, tc.want) {
				t.Fatalf("listed %v, want %v", ids, tc.want)
			}
		})
	}
}
