package e2e

import (
	"regexp"
	"testing"

	fsimg "github.com/checkpoint-restore/go-criu/v8/crit/images/fs"
	ipcvar "github.com/checkpoint-restore/go-criu/v8/crit/images/ipc-var"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/mm"
	remap "github.com/checkpoint-restore/go-criu/v8/crit/images/remap-file-path"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/utsns"
	"google.golang.org/protobuf/proto"

	"github.com/cri-shim/cri-shim/internal/criucheck/criutest"
)

// editOne applies edit to the single entry of the image matching re (the
// first task's where there are several), encoded with magic.
func editOne[M proto.Message](t testing.TB, imgs ckptImages, re, magic string, newMsg func() M, edit func(M)) {
	t.Helper()
	for name, b := range imgs {
		if !regexp.MustCompile(re).MatchString(name) {
			continue
		}
		es, err := criutest.Decode(b, newMsg)
		if err != nil || len(es) != 1 {
			t.Fatalf("%s: %d entries, %v", name, len(es), err)
		}
		edit(es[0])
		if imgs[name], err = criutest.Encode(magic, es[0]); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("no image %s in the checkpoint", re)
}

// hostilePathEdits are issue 41's classes of paths and namespace images,
// one edit each: a file reached through /proc's magic links (CRIU opens it
// from a root holding the node's /proc), the task's root moved off the
// container's root, a LINKED remap (hard-linked as root), memory at
// address 0, a host name CRIU would write into the pod's UTS namespace,
// and an IPC limit it would raise in the pod's IPC namespace.
func hostilePathEdits() []hostileEdit {
	return []hostileEdit{
		{"a file through /proc/self/root", func(t testing.TB, imgs ckptImages) {
			openFile(t, imgs, "/proc/self/root/etc/shadow")
		}, "reg.name", 0, nil, false},
		{"the task's root moved off the container's", func(t testing.TB, imgs ckptImages) {
			openFile(t, imgs, "/tmp")
			editOne(t, imgs, `^fs-1\.img$`, "FS", func() *fsimg.FsEntry { return new(fsimg.FsEntry) }, func(e *fsimg.FsEntry) {
				e.RootId = proto.Uint32(1 << 20) // openFile's entry
			})
		}, "root_id", 0, nil, false},
		{"a linked remap", func(t testing.TB, imgs ckptImages) {
			openFile(t, imgs, "/etc/hostname")
			b, err := criutest.Encode("REMAP_FPATH", &remap.RemapFilePathEntry{OrigId: proto.Uint32(1 << 20), RemapId: proto.Uint32(1 << 21),
				RemapType: remap.RemapType_LINKED.Enum()})
			if err != nil {
				t.Fatal(err)
			}
			imgs["remap-fpath.img"] = b
		}, "remap_type", 0, nil, false},
		{"memory at address 0", func(t testing.TB, imgs ckptImages) {
			editOne(t, imgs, `^mm-1\.img$`, "MM", func() *mm.MmEntry { return new(mm.MmEntry) }, func(e *mm.MmEntry) {
				e.Vmas[0].Start = proto.Uint64(0)
			})
		}, "vmas[0].start", 0, nil, false},
		{"a host name CRIU would set", func(t testing.TB, imgs ckptImages) {
			editOne(t, imgs, `^utsns-[0-9]+\.img$`, "UTSNS", func() *utsns.UtsnsEntry { return new(utsns.UtsnsEntry) }, func(e *utsns.UtsnsEntry) {
				e.Nodename = proto.String("pod\nroot")
			})
		}, "nodename", 0, nil, false},
		{"an IPC limit CRIU would raise", func(t testing.TB, imgs ckptImages) {
			editOne(t, imgs, `^ipcns-var-[0-9]+\.img$`, "IPC_VAR", func() *ipcvar.IpcVarEntry { return new(ipcvar.IpcVarEntry) }, func(e *ipcvar.IpcVarEntry) {
				e.MsgCtlmnb = proto.Uint32(1 << 30)
			})
		}, "msg_ctlmnb", 0, nil, false},
	}
}
