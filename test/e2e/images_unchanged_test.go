package e2e

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Issue 27's acceptance: `crictl images` is the same before and after every
// restore of the suite, no image name added and none pointing at another
// image. Each test that restores takes imagesSnapshot after the pulls and
// pushes it does on purpose and before its restore, and calls
// assertNoImageChange once the restore is done (the restored containers
// started), so the check fails only because of the restore. Images removed
// meanwhile are no failure: a test's clean-up may remove what it pulled.

// imagesSnapshot is the images of the test node as crictl images lists them
// through the shim (the CRI's ListImages): every repo tag and repo digest
// with the ID of the image it names; an image with neither is listed as
// "<none>@" and its ID.
func imagesSnapshot(t testing.TB) map[string]string {
	t.Helper()
	return imagesSnapshotOn(t, node.env["SHIM_SOCK"])
}

// imagesSnapshotOn is imagesSnapshot of the node whose shim listens on sock.
func imagesSnapshotOn(t testing.TB, sock string) map[string]string {
	t.Helper()
	r, err := runtimeapi.NewImageServiceClient(dial(t, sock)).ListImages(ctxT(t, time.Minute), &runtimeapi.ListImagesRequest{})
	if err != nil {
		t.Fatalf("ListImages on %s: %v", sock, err)
	}
	names := map[string]string{}
	for _, im := range r.Images {
		for _, n := range append(slices.Clone(im.RepoTags), im.RepoDigests...) {
			names[n] = im.Id
		}
		if len(im.RepoTags)+len(im.RepoDigests) == 0 {
			names["<none>@"+im.Id] = im.Id
		}
	}
	return names
}

// assertNoImageChange fails the test if an image name of the test node was
// added since before, or now names another image; what is the restore.
func assertNoImageChange(t testing.TB, before map[string]string, what string) {
	t.Helper()
	assertNoImageChangeOn(t, node.env["SHIM_SOCK"], before, what)
}

// assertNoImageChangeOn is assertNoImageChange on the node whose shim
// listens on sock.
func assertNoImageChangeOn(t testing.TB, sock string, before map[string]string, what string) {
	t.Helper()
	if changed := imageChanges(before, imagesSnapshotOn(t, sock)); len(changed) > 0 {
		t.Errorf("crictl images changed by %s:\n%s", what, strings.Join(changed, "\n"))
	}
}

// imageChanges lists the names of after that before did not have, or that
// named another image in before, sorted; a name gone is not a change.
func imageChanges(before, after map[string]string) []string {
	var out []string
	for _, n := range slices.Sorted(maps.Keys(after)) {
		switch was, ok := before[n]; {
		case !ok:
			out = append(out, fmt.Sprintf("added %s (image %s)", n, after[n]))
		case was != after[n]:
			out = append(out, fmt.Sprintf("%s now names image %s, was %s", n, after[n], was))
		}
	}
	return out
}

// imageChanges itself, without the node: added and moved names are
// changes, removed ones are not.
func TestImageChanges(t *testing.T) {
	before := map[string]string{"busybox:cri-shim": "sha256:b", "pause:3.10": "sha256:p", "gone:1": "sha256:g"}
	if got := imageChanges(before, map[string]string{"busybox:cri-shim": "sha256:b", "pause:3.10": "sha256:p"}); len(got) != 0 {
		t.Errorf("a removal reported: %v", got)
	}
	got := imageChanges(before, map[string]string{"busybox:cri-shim": "sha256:e", "pause:3.10": "sha256:p", "evil:latest": "sha256:e", "<none>@sha256:x": "sha256:x"})
	want := []string{"added <none>@sha256:x (image sha256:x)", "busybox:cri-shim now names image sha256:e, was sha256:b", "added evil:latest (image sha256:e)"}
	if !slices.Equal(got, want) {
		t.Errorf("changes %q, want %q", got, want)
	}
}
