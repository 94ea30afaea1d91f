package podtable

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/podspec"
)

// feature records every step it is asked for in log.
type feature struct {
	name               string
	log                *[]string
	refuse, failCommit bool
	spec               *podspec.Spec
}

func (f feature) Admit(_ context.Context, p *Pod) (Admission, error) {
	*f.log = append(*f.log, f.name+" admit")
	if f.spec != nil {
		*f.spec = p.Spec
	}
	a := Admission{
		Commit: func(_ context.Context, id string) error {
			*f.log = append(*f.log, f.name+" commit "+id)
			if f.failCommit {
				return errors.New(f.name + " could not record")
			}
			return nil
		},
		Undo: func(id string) { *f.log = append(*f.log, f.name+" undo "+id) },
		Done: func() { *f.log = append(*f.log, f.name+" done") },
	}
	if f.refuse {
		return a, errors.New(f.name + " refuses")
	}
	return a, nil
}

// Features admit in order before the sandbox exists and commit in order
// after; a refusal creates nothing; a failed commit undoes the commits before
// it, in reverse, and removes the sandbox once; Done runs whichever way.
func TestAdmissions(t *testing.T) {
	req := &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{
		Annotations: map[string]string{podspec.TerminationKey: "immediate"}}}
	run := func(fs ...feature) ([]string, *lister, error) {
		var log []string
		rt := &lister{}
		as := Admissions{RT: rt, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
		for _, f := range fs {
			f.log = &log
			as.Features = append(as.Features, f)
		}
		_, err := as.Run(context.Background(), req, func(context.Context, *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
			log = append(log, "create")
			return &runtimeapi.RunPodSandboxResponse{PodSandboxId: "sb"}, nil
		})
		return log, rt, err
	}

	var spec podspec.Spec
	log, rt, err := run(feature{name: "a", spec: &spec}, feature{name: "b"})
	if want := []string{"a admit", "b admit", "create", "a commit sb", "b commit sb", "a done", "b done"}; err != nil || !slices.Equal(log, want) {
		t.Fatalf("admitted: %v %v, want %v", log, err, want)
	}
	if spec.Termination != podspec.TerminationImmediate || len(rt.removed) != 0 {
		t.Fatalf("spec %+v, removed %v", spec, rt.removed)
	}

	log, rt, err = run(feature{name: "a"}, feature{name: "b", refuse: true}, feature{name: "c"})
	if want := []string{"a admit", "b admit", "a done", "b done"}; err == nil || !slices.Equal(log, want) || len(rt.removed) != 0 {
		t.Fatalf("refused: %v %v, removed %v; want %v", log, err, rt.removed, want)
	}

	log, rt, err = run(feature{name: "a"}, feature{name: "b"}, feature{name: "c", failCommit: true}, feature{name: "d"})
	want := []string{"a admit", "b admit", "c admit", "d admit", "create", "a commit sb", "b commit sb", "c commit sb",
		"b undo sb", "a undo sb", "a done", "b done", "c done", "d done"}
	if err == nil || err.Error() != "c could not record" || !slices.Equal(log, want) {
		t.Fatalf("failed commit: %v %v, want %v", log, err, want)
	}
	if !slices.Equal(rt.stopped, []string{"sb"}) || !slices.Equal(rt.removed, []string{"sb"}) {
		t.Fatalf("rollback: stopped %v removed %v, want the sandbox once", rt.stopped, rt.removed)
	}
}
