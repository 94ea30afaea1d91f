package e2e

import (
	"archive/tar"
	"bufio"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/checkpoint-restore/go-criu/v8/crit/images/creds"
	criucore "github.com/checkpoint-restore/go-criu/v8/crit/images/criu-core"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/fdinfo"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/fown"
	ghostfile "github.com/checkpoint-restore/go-criu/v8/crit/images/ghost-file"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/inventory"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/regfile"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/seccomp"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/criucheck/criutest"
)

// lockedDownCfg is the counter as a locked-down container of user uid:
// every capability dropped, no privilege escalation, the RuntimeDefault
// seccomp profile. (CRIU cannot checkpoint a process of another user than
// root on this machine: its prlimit of the task needs CAP_SYS_RESOURCE,
// which the environment lacks; shared/NODE-STACK.md.)
func lockedDownCfg(name string, uid int64) *runtimeapi.ContainerConfig {
	c := counterCfg(name)
	sc := c.Linux.SecurityContext
	sc.RunAsUser = &runtimeapi.Int64Value{Value: uid}
	sc.Capabilities = &runtimeapi.Capability{DropCapabilities: []string{"ALL"}}
	sc.NoNewPrivs = true
	sc.Seccomp = &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_RuntimeDefault}
	// The kubelet's default masks and read-only paths, which it sends with
	// every unprivileged container (kubernetes pkg/securitycontext/util.go,
	// defaultMaskedPaths, defaultReadonlyPaths); containerd sets none when
	// the request has none.
	sc.MaskedPaths = []string{"/proc/asound", "/proc/acpi", "/proc/interrupts", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
		"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap"}
	sc.ReadonlyPaths = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}
	return c
}

// ckptImages is a container archive's CRIU images, by file name.
type ckptImages map[string][]byte

// editArchive rewrites the CRIU images (checkpoint/*) of a container
// archive with edit; the rest of the archive is kept.
func editArchive(t testing.TB, archive string, edit func(ckptImages)) {
	t.Helper()
	imgs := ckptImages{}
	rewriteArchive(t, archive, func(h *tar.Header, body []byte) ([]byte, bool) {
		if strings.HasPrefix(h.Name, "checkpoint/") && h.Typeflag == tar.TypeReg {
			imgs[strings.TrimPrefix(h.Name, "checkpoint/")] = body
			return nil, false
		}
		return body, true
	}, func(tw *tar.Writer) {
		edit(imgs)
		for name, body := range imgs {
			tw.WriteHeader(&tar.Header{Name: "checkpoint/" + name, Mode: 0o600, Size: int64(len(body)), Typeflag: tar.TypeReg, ModTime: time.Now()})
			tw.Write(body)
		}
	})
}

// editCore applies edit to the core image of the tree's first process.
func editCore(edit func(*criucore.CoreEntry)) func(t testing.TB, imgs ckptImages) {
	return func(t testing.TB, imgs ckptImages) {
		name := firstCore(t, imgs)
		cs, err := criutest.Decode(imgs[name], func() *criucore.CoreEntry { return new(criucore.CoreEntry) })
		if err != nil || len(cs) != 1 {
			t.Fatalf("%s: %v", name, err)
		}
		edit(cs[0])
		b, err := criutest.Encode("CORE", cs[0])
		if err != nil {
			t.Fatal(err)
		}
		imgs[name] = b
	}
}

func firstCore(t testing.TB, imgs ckptImages) string {
	for _, n := range []string{"core-1.img"} {
		if imgs[n] != nil {
			return n
		}
	}
	t.Fatalf("no core-1.img among %d images", len(imgs))
	return ""
}

func credsOf(c *criucore.CoreEntry) *creds.CredsEntry { return c.ThreadCore.Creds }

// openFile adds to files.img a regular file open for reading at path name.
func openFile(t testing.TB, imgs ckptImages, name string) {
	fs, err := criutest.Decode(imgs["files.img"], func() *fdinfo.FileEntry { return new(fdinfo.FileEntry) })
	if err != nil {
		t.Fatal(err)
	}
	fs = append(fs, &fdinfo.FileEntry{Type: fdinfo.FdTypes_REG.Enum(), Id: proto.Uint32(1 << 20), Reg: &regfile.RegFileEntry{
		Id: proto.Uint32(1 << 20), Flags: proto.Uint32(0), Pos: proto.Uint64(0), Name: proto.String(name),
		Fown: &fown.FownEntry{Uid: proto.Uint32(0), Euid: proto.Uint32(0), Signum: proto.Uint32(0), PidType: proto.Uint32(0), Pid: proto.Uint32(0)}}})
	if imgs["files.img"], err = criutest.Encode("FILES", criutest.Messages(fs)...); err != nil {
		t.Fatal(err)
	}
}

// TestHostileCheckpointsAreRefused (issue 28, item 1, and issue 41, item 4,
// on the real stack): a locked-down container is checkpointed; its CRIU
// images or its rootfs changes are edited as an attacker who can write the
// archive would, one edit per checkpoint, and each is restored through the
// shim. Each restore is refused naming the field, and leaves nothing: no
// sandbox, no staged files, no image. The unedited checkpoint restores and
// runs (the positive control), and so does one whose dump files name
// another image (those are never read).
func TestHostileCheckpointsAreRefused(t *testing.T) {
	needNode(t)
	pauseKubelet(t)
	rt := runtimeClient(t, node.env["SHIM_SOCK"])
	cfg := lockedDownCfg("main", 0)
	sb, ids, logs := startPod(t, rt, "hostile-src", cfg)
	eventually(t, 30*time.Second, "the counter counting", func() error {
		if len(counters(t, filepath.Join(logs, "main.log"))) < 3 {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	last := lastCounter(t, filepath.Join(logs, "main.log")) // reached before the checkpoint
	src := newCheckpointDir(t, "hostile-src")
	if _, err := rt.CheckpointPod(ctxT(t, 2*time.Minute), &runtimeapi.CheckpointPodRequest{PodSandboxId: sb, OutputPath: src, ContainerIds: []string{ids["main"]}}); err != nil {
		if m := regexp.MustCompile(`path= (\S+\.log)`).FindStringSubmatch(err.Error()); m != nil {
			if b, rerr := os.ReadFile(m[1]); rerr == nil {
				t.Logf("%s:\n%s", m[1], lastLines(string(b), 30))
			}
		}
		t.Fatal(err)
	}
	removePod(rt, sb)

	var restoredLogs string
	restoreCfg := func(t *testing.T, dir, name string, cfg *runtimeapi.ContainerConfig) (string, error) {
		l := filepath.Join(t.TempDir(), "logs")
		restoredLogs = l
		os.MkdirAll(l, 0o755)
		rr, err := rt.RestorePod(ctxT(t, 2*time.Minute), &runtimeapi.RestorePodRequest{CheckpointPath: dir,
			Config: sandboxCfg(name, name+"-uid", l), ContainerConfigs: []*runtimeapi.ContainerConfig{cfg}})
		if err != nil {
			return "", err
		}
		t.Cleanup(func() { removePod(rt, rr.PodSandboxId) })
		_, err = rt.StartContainer(ctxT(t, 2*time.Minute), &runtimeapi.StartContainerRequest{ContainerId: rr.RestoredContainers[0].ContainerId})
		return rr.PodSandboxId, err
	}
	restore := func(t *testing.T, dir, name string, uid int64) (string, error) {
		return restoreCfg(t, dir, name, lockedDownCfg("main", uid))
	}

	t.Run("unedited", func(t *testing.T) {
		t0 := time.Now()
		if _, err := restore(t, src, "hostile-control", 0); err != nil {
			t.Fatalf("the unedited checkpoint was not restored: %v", err)
		}
		waitLine(t, filepath.Join(restoredLogs, "main.log"), t0, 30*time.Second, "the restored counter counting")
		if _, first := countersSince(t, filepath.Join(restoredLogs, "main.log"), t0); first < last {
			t.Fatalf("the restored process counted %d first, the checkpointed one had reached %d: not a restore", first, last)
		}
	})

	cases := append(hostileEdits(), hostileDiffEdits()...)
	before := imagesSnapshot(t)
	staging := filepath.Join(node.env["CHECKPOINTS"], ".restore-staging")
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := newCheckpointDir(t, fmt.Sprintf("hostile-%d", i))
			copyTree(t, src, dir)
			archives, _ := filepath.Glob(filepath.Join(dir, "containers", "*.tar"))
			if len(archives) != 1 {
				t.Fatalf("archives: %v", archives)
			}
			if tc.edit != nil {
				editArchive(t, archives[0], func(imgs ckptImages) { tc.edit(t, imgs) })
			}
			if tc.diff != nil {
				editDiff(t, archives[0], tc.diff)
			}
			name := fmt.Sprintf("hostile-r%d", i)
			sb, err := restore(t, dir, name, tc.uid)
			if err == nil {
				t.Fatalf("restored; want it refused naming %q", tc.field)
			}
			if !strings.Contains(err.Error(), "checkpoint refused") || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("want a refusal naming %q, got %v", tc.field, err)
			}
			if tc.atStart {
				if sb == "" {
					t.Fatalf("refused by RestorePod; want the runtime shim's refusal at StartContainer: %v", err)
				}
				noneRunning(t, rt, sb)
			} else {
				sbs, err := rt.ListPodSandbox(ctxT(t, 30*time.Second), &runtimeapi.ListPodSandboxRequest{})
				if err != nil {
					t.Fatal(err)
				}
				for _, s := range sbs.Items {
					if s.GetMetadata().GetName() == name {
						t.Fatalf("the refused restore left sandbox %s (%v)", s.Id, s.State)
					}
				}
			}
			if ents, _ := os.ReadDir(staging); len(ents) > 0 {
				t.Fatalf("the refused restore left %d staged restores in %s", len(ents), staging)
			}
		})
	}

	// The files a checkpoint holds open are checked by the runtime shim at
	// task create, on the rootfs with the checkpoint's changes applied and
	// the pod's volumes mounted: CRIU opens them as root, so a file the
	// container's user could not open is refused. The pod runs as 1000 and
	// mounts a root-only host file, as a Secret's key with mode 0400 would
	// be; the images are the checkpoint's, made a process of user 1000.
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("not for uid 1000"), 0o600); err != nil {
		t.Fatal(err)
	}
	withToken := func() *runtimeapi.ContainerConfig {
		c := lockedDownCfg("main", 1000)
		c.Mounts = append(c.Mounts, &runtimeapi.Mount{ContainerPath: "/secret/token", HostPath: token, Readonly: true})
		return c
	}
	edited := func(t *testing.T, name string, edit func(testing.TB, ckptImages)) string {
		dir := newCheckpointDir(t, name)
		copyTree(t, src, dir)
		archives, _ := filepath.Glob(filepath.Join(dir, "containers", "*.tar"))
		if len(archives) != 1 {
			t.Fatalf("archives: %v", archives)
		}
		editArchive(t, archives[0], func(imgs ckptImages) { edit(t, imgs) })
		return dir
	}
	t.Run("a process of user 1000 (the control of the file check)", func(t *testing.T) {
		dir := edited(t, "hostile-user", func(t testing.TB, imgs ckptImages) {
			asUser1000(t, imgs)
			addBindMount(t, imgs, "/secret/token", token)
		})
		t0 := time.Now()
		if _, err := restoreCfg(t, dir, "hostile-user", withToken()); err != nil {
			t.Fatalf("a checkpoint of user 1000 holding no file it cannot open was not restored: %v", err)
		}
		waitLine(t, filepath.Join(restoredLogs, "main.log"), t0, 30*time.Second, "the restored counter counting")
		if _, first := countersSince(t, filepath.Join(restoredLogs, "main.log"), t0); first < last {
			t.Fatalf("the restored process counted %d first, the checkpointed one had reached %d: not a restore", first, last)
		}
	})
	t.Run("a volume's root-only file held open", func(t *testing.T) {
		dir := edited(t, "hostile-token", func(t testing.TB, imgs ckptImages) {
			asUser1000(t, imgs)
			addBindMount(t, imgs, "/secret/token", token)
			openFile(t, imgs, "/secret/token")
		})
		sb, err := restoreCfg(t, dir, "hostile-token", withToken())
		if err == nil || !strings.Contains(err.Error(), "checkpoint refused") || !strings.Contains(err.Error(), `"/secret/token": mode 0600`) {
			t.Fatalf("want StartContainer refused naming /secret/token, got %v", err)
		}
		t.Logf("refused: %v", err)
		noneRunning(t, rt, sb)
		if ents, _ := os.ReadDir(staging); len(ents) > 0 {
			t.Fatalf("the refused restore left %d staged restores in %s", len(ents), staging)
		}
	})
	assertNoImageChange(t, before, "hostile checkpoint restores")
}

// noneRunning fails t if a container of sandbox sb runs: the sandbox of a
// restore refused at StartContainer stays (the kubelet removes it), its
// container must not run.
func noneRunning(t testing.TB, rt runtimeapi.RuntimeServiceClient, sb string) {
	t.Helper()
	cs, err := rt.ListContainers(ctxT(t, 30*time.Second), &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: sb}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs.Containers {
		if c.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
			t.Fatalf("container %s of the refused restore is running", c.Id)
		}
	}
}

// asUser1000 makes every thread of the tree a process of user 1000.
func asUser1000(t testing.TB, imgs ckptImages) {
	for name := range imgs {
		if !regexp.MustCompile(`^core-[0-9]+\.img$`).MatchString(name) {
			continue
		}
		cs, err := criutest.Decode(imgs[name], func() *criucore.CoreEntry { return new(criucore.CoreEntry) })
		if err != nil || len(cs) != 1 {
			t.Fatalf("%s: %v", name, err)
		}
		cr := credsOf(cs[0])
		cr.Uid, cr.Euid, cr.Suid, cr.Fsuid = proto.Uint32(1000), proto.Uint32(1000), proto.Uint32(1000), proto.Uint32(1000)
		cr.Groups = []uint32{cr.GetGid()} // root's supplementary groups are not user 1000's
		if imgs[name], err = criutest.Encode("CORE", cs[0]); err != nil {
			t.Fatal(err)
		}
	}
}

// hostileEdit is one edit of a checkpoint an attacker who can write the
// archive could make: of its CRIU images (edit) and of its rootfs changes
// (diff: entries appended to rootfs-diff.tar), either nil for none; the
// field its refusal names, the user of the pod that restores it, and where
// it is refused: by RestorePod's checks (staging), or only by the runtime
// shim while StartContainer applies the rootfs changes (atStart: what an
// entry may write depends on the rootfs it lands in).
type hostileEdit struct {
	name    string
	edit    func(testing.TB, ckptImages)
	field   string
	uid     int64 // the restoring pod's user
	diff    func(testing.TB, *tar.Writer)
	atStart bool
}

// hostileEdits are issue 28's hostile checkpoints, each refused by the image
// check before anything of it runs.
func hostileEdits() []hostileEdit {
	add := func(set func(*creds.CredsEntry, []uint32)) func(*criucore.CoreEntry) {
		return func(c *criucore.CoreEntry) { set(credsOf(c), criutest.Caps("CAP_SYS_ADMIN", "CAP_DAC_READ_SEARCH")) }
	}
	return append([]hostileEdit{
		{"effective capabilities raised", editCore(add(func(c *creds.CredsEntry, w []uint32) { c.CapEff = w })), "cap_eff", 0, nil, false},
		{"permitted capabilities raised", editCore(add(func(c *creds.CredsEntry, w []uint32) { c.CapPrm = w })), "cap_prm", 0, nil, false},
		{"inheritable capabilities raised", editCore(add(func(c *creds.CredsEntry, w []uint32) { c.CapInh = w })), "cap_inh", 0, nil, false},
		{"bounding set raised", editCore(add(func(c *creds.CredsEntry, w []uint32) { c.CapBnd = w })), "cap_bnd", 0, nil, false},
		{"ambient capabilities raised", editCore(add(func(c *creds.CredsEntry, w []uint32) { c.CapAmb = w })), "cap_amb", 0, nil, false},
		// The images as they are (uid 0), restored by a pod that runs as
		// 1000 (runAsNonRoot): the restoring pod's spec is the measure.
		{"uid 0 in a pod running as 1000", func(testing.TB, ckptImages) {}, "creds.uid", 1000, nil, false},
		{"no_new_privs cleared", editCore(func(c *criucore.CoreEntry) { credsOf(c).NoNewPrivs = proto.Uint32(0) }), "no_new_privs", 0, nil, false},
		{"seccomp removed", editCore(func(c *criucore.CoreEntry) {
			c.ThreadCore.SeccompMode = criucore.SeccompMode_disabled.Enum()
			c.ThreadCore.SeccompFilter = nil
		}), "seccomp_mode", 0, nil, false},
		{"seccomp filter replaced by allow-all", func(t testing.TB, imgs ckptImages) {
			b, err := criutest.Encode("SECCOMP", &seccomp.SeccompEntry{SeccompFilters: []*seccomp.SeccompFilter{{Filter: criutest.AllowAll()}}})
			if err != nil {
				t.Fatal(err)
			}
			imgs["seccomp.img"] = b
			editCore(func(c *criucore.CoreEntry) { c.ThreadCore.SeccompFilter = proto.Uint32(0) })(t, imgs)
		}, "seccomp_filters", 0, nil, false},
		{"the host's mount namespace", func(t testing.TB, imgs ckptImages) {
			inv, err := criutest.Decode(imgs["inventory.img"], func() *inventory.InventoryEntry { return new(inventory.InventoryEntry) })
			if err != nil || len(inv) != 1 {
				t.Fatalf("inventory.img: %v", err)
			}
			editCore(func(c *criucore.CoreEntry) {
				if c.Ids != nil { // CRIU 4 keeps them in ids-1.img
					c.Ids.MntNsId = proto.Uint32(inv[0].RootIds.GetMntNsId())
				}
			})(t, imgs)
			if b := imgs["ids-1.img"]; b != nil {
				ids, _ := criutest.Decode(b, func() *criucore.TaskKobjIdsEntry { return new(criucore.TaskKobjIdsEntry) })
				ids[0].MntNsId = proto.Uint32(inv[0].RootIds.GetMntNsId())
				imgs["ids-1.img"], _ = criutest.Encode("IDS", ids[0])
			}
		}, "mnt_ns_id", 0, nil, false},
		{"a file of the host by ..", func(t testing.TB, imgs ckptImages) { openFile(t, imgs, "/../../../../etc/shadow") }, "reg.name", 0, nil, false},
		{"a block device node", func(t testing.TB, imgs ckptImages) {
			b, err := criutest.Encode("GHOST_FILE", &ghostfile.GhostFileEntry{Uid: proto.Uint32(0), Gid: proto.Uint32(0),
				Mode: proto.Uint32(unix.S_IFBLK | 0o666), Rdev: proto.Uint32(uint32(unix.Mkdev(8, 0)))})
			if err != nil {
				t.Fatal(err)
			}
			imgs["ghost-file-99.img"] = b
		}, "device node", 0, nil, false},
		{"an image file CRIU would act on unchecked", func(t testing.TB, imgs ckptImages) { imgs["apparmor.img"] = []byte("policy") }, "apparmor.img", 0, nil, false},
	}, append(hostileTreeEdits(), hostilePathEdits()...)...)
}

// copyTree copies a checkpoint directory.
func copyTree(t testing.TB, from, to string) {
	t.Helper()
	err := filepath.Walk(from, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, p)
		dst := filepath.Join(to, rel)
		if fi.IsDir() {
			return os.MkdirAll(dst, 0o700)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, b, fi.Mode().Perm())
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Issue 28's acceptance through the registry, for every hostile edit: a
// tenant checkpoints its own locked-down pod (every capability dropped, no
// privilege escalation, RuntimeDefault seccomp), edits the CRIU images one
// way per copy, pushes each copy to the stack's TLS registry and creates a
// pod of its namespace restoring from the reference. Each pull is allowed
// (the registry is on the allow-list with its CA, the namespace binding
// holds) and each restore is refused by the image check: a
// CheckpointRefused event naming the field, the pod never Running, no
// image name added. The unedited copy, pushed the same way, restores and
// runs the checkpointed process (the positive control).
func TestHostileCheckpointByReferenceIsRefused(t *testing.T) {
	cs := needAPIServer(t)
	addr, ca := startTLSRegistry(t)
	withShimConfig(t, fmt.Sprintf("[kubernetes]\nkubeconfig = %q\nnode_name = %q\n\n[[checkpoint.registries]]\nhost = %q\nnamespaces = [\"*\"]\nanonymous_push = true\nca_file = %q\n",
		node.env["KUBELET_KUBECONFIG"], node.env["NODE_NAME"], addr, ca))
	apiKubelet(t, cs)
	ns := testNamespace(t, cs, "e2e-hostile")
	if _, err := cs.CoreV1().Pods(ns).Create(ctxT(t, 10*time.Second), lockedDownAPIPod("src", "", 0), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	secret := runningSecret(t, cs, ns, "src", 2*time.Minute)
	cp := "e2e-hostile-" + strings.ReplaceAll(ns, ".", "-")
	shimRun(t, "checkpoint", "--namespace", ns, "--pod", "src", "--name", cp)
	src := filepath.Join(node.env["CHECKPOINTS"], cp)
	t.Cleanup(func() { os.RemoveAll(src) })
	push := func(t *testing.T, name string, edit func(testing.TB, ckptImages), replace func(archive string)) string {
		dir := filepath.Join(node.env["CHECKPOINTS"], name)
		t.Cleanup(func() { os.RemoveAll(dir) })
		copyTree(t, src, dir)
		archives, _ := filepath.Glob(filepath.Join(dir, "containers", "*.tar"))
		if len(archives) != 1 {
			t.Fatalf("archives: %v", archives)
		}
		if edit != nil {
			editArchive(t, archives[0], func(imgs ckptImages) { edit(t, imgs) })
		}
		if replace != nil {
			replace(archives[0])
		}
		matchManifestSize(t, dir, archives[0])
		return pushCheckpoint(t, name, addr+"/e2e/"+name+":v1", "--ca-file", ca)
	}
	images := imagesSnapshot(t) // the pushes change nothing on the node
	t.Run("unedited", func(t *testing.T) {
		ref := push(t, cp+"-control", nil, nil)
		if _, err := cs.CoreV1().Pods(ns).Create(ctxT(t, 10*time.Second), lockedDownAPIPod("control", ref, 0), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		restoredWithSecret(t, cs, ns, "control", secret)
	})
	// What the refusals may not grow: the checkpoint root (a refused pull
	// or restore leaves nothing in it) and the shim's memory (each archive
	// and image is checked as a stream, with bounded memory).
	pid := shimPID(t)
	rss0 := procStatusKiB(t, pid, "VmRSS")
	entries0, du0 := rootEntries(t, cp), diskUse(t, cp)
	for i, tc := range hostileEdits() {
		t.Run(tc.name, func(t *testing.T) {
			ref := push(t, fmt.Sprintf("%s-%d", cp, i), tc.edit, nil)
			name := fmt.Sprintf("r%d", i)
			if _, err := cs.CoreV1().Pods(ns).Create(ctxT(t, 10*time.Second), lockedDownAPIPod(name, ref, tc.uid), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			msg := reasonEvent(t, cs, ns, name, "CheckpointRefused")
			if !strings.Contains(msg, tc.field) {
				t.Fatalf("CheckpointRefused event %q does not name %s", msg, tc.field)
			}
			t.Logf("refused: %s", msg)
			stillPending(t, cs, ns, name, secret)
		})
	}
	// The same checks on the warm start by annotation of a directory: a pod
	// of the namespace whose restore-from names a checkpoint directory of
	// the node (not an image reference) with one hostile edit, the cgroup
	// property that climbs out of CRIU's yard.
	t.Run("warm start by annotation of an edited directory", func(t *testing.T) {
		const name = "by-dir"
		dir := filepath.Join(node.env["CHECKPOINTS"], cp+"-dir")
		t.Cleanup(func() { os.RemoveAll(dir) })
		copyTree(t, src, dir)
		archives, _ := filepath.Glob(filepath.Join(dir, "containers", "*.tar"))
		if len(archives) != 1 {
			t.Fatalf("archives: %v", archives)
		}
		editArchive(t, archives[0], func(imgs ckptImages) { hostileTreeEdits()[0].edit(t, imgs) })
		if _, err := cs.CoreV1().Pods(ns).Create(ctxT(t, 10*time.Second), lockedDownAPIPod(name, filepath.Base(dir), 0), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		msg := reasonEvent(t, cs, ns, name, "CheckpointRefused")
		if !strings.Contains(msg, "properties ../") {
			t.Fatalf("CheckpointRefused event %q does not name the cgroup property", msg)
		}
		t.Logf("refused: %s", msg)
		stillPending(t, cs, ns, name, secret)
	})
	// Archives refused while they stream in, by the pull's archive check,
	// before anything of them is kept: two built to exhaust the node, and
	// one whose config.dump names a base image by a registry reference
	// (containerd's own restore would have pulled it from there). Each is a
	// CheckpointRefused event naming what is wrong.
	for i, g := range []struct {
		name, want string
		replace    func(t testing.TB, archive string)
	}{
		{"member names of 256 KiB", "more than 4096", func(t testing.TB, path string) {
			giantArchive(t, path, 64, func(i int) string { return fmt.Sprintf("checkpoint/%d-%s", i, strings.Repeat("n", 256<<10)) })
		}},
		{"a million members", "more than 100000 entries", func(t testing.TB, path string) {
			giantArchive(t, path, 1000000, func(i int) string { return fmt.Sprintf("checkpoint/f%d", i) })
		}},
		{"config.dump naming another image", "not by image ID", func(t testing.TB, path string) {
			rewriteArchive(t, path, func(h *tar.Header, body []byte) ([]byte, bool) {
				if h.Name != "config.dump" {
					return body, true
				}
				var c map[string]any
				if err := json.Unmarshal(body, &c); err != nil {
					t.Fatal(err)
				}
				c["rootfsImageRef"] = addr + "/e2e/evil:latest"
				b, err := json.Marshal(c)
				if err != nil {
					t.Fatal(err)
				}
				return b, true
			}, nil)
		}},
	} {
		t.Run(g.name, func(t *testing.T) {
			ref := push(t, fmt.Sprintf("%s-archive%d", cp, i), nil, func(path string) { g.replace(t, path) })
			name := fmt.Sprintf("archive%d", i)
			if _, err := cs.CoreV1().Pods(ns).Create(ctxT(t, 10*time.Second), lockedDownAPIPod(name, ref, 0), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			msg := reasonEvent(t, cs, ns, name, "CheckpointRefused")
			if !strings.Contains(msg, g.want) {
				t.Fatalf("CheckpointRefused event %q does not say %q", truncateMsg(msg, 300), g.want)
			}
			t.Logf("refused: %s", truncateMsg(msg, 300))
			stillPending(t, cs, ns, name, secret)
		})
	}
	assertNoImageChange(t, images, "the refused restores of "+ns+" from "+addr)
	// A refused pulled checkpoint is removed at the refusal (its pod stays
	// pending on the recorded refusal): the checkpoint root holds no new
	// entry and no more bytes than before (fewer when the sweep of unused
	// pulled checkpoints took the control's meanwhile).
	var left []string
	for name := range rootEntries(t, cp) {
		if !entries0[name] {
			left = append(left, name)
		}
	}
	if len(left) != 0 {
		t.Errorf("the refused restores left %d entries in the checkpoint root: %v", len(left), left)
	}
	if du := diskUse(t, cp); du > du0 {
		t.Errorf("the checkpoint root holds %d bytes after the refusals, %d before", du, du0)
	}
	peak := procStatusKiB(t, pid, "VmHWM")
	t.Logf("shim (pid %d) resident: %d KiB before the refusals, peak %d KiB", pid, rss0, peak)
	if peak-rss0 > 64<<10 {
		t.Errorf("the shim's resident memory peaked %d KiB above where it was before the refusals (bound 64 MiB)", peak-rss0)
	}
}

// matchManifestSize records archive's new size in dir's manifest.json, as
// an attacker rewriting the archive would: the pull compares the two, and
// the image check, not that comparison, is what is tested.
func matchManifestSize(t testing.TB, dir, archive string) {
	t.Helper()
	fi, err := os.Stat(archive)
	if err != nil {
		t.Fatal(err)
	}
	mf := filepath.Join(dir, "manifest.json")
	b, err := os.ReadFile(mf)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	cs, _ := m["containers"].([]any)
	for _, c := range cs {
		if e, ok := c.(map[string]any); ok && e["archive"] == "containers/"+filepath.Base(archive) {
			e["sizeBytes"] = fi.Size()
		}
	}
	if b, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(mf, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// giantArchive writes in place of archive a tar of n empty files named by
// member.
func giantArchive(t testing.TB, archive string, n int, member func(int) string) {
	t.Helper()
	f, err := os.Create(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	tw := tar.NewWriter(bw)
	for i := 0; i < n; i++ {
		if err := tw.WriteHeader(&tar.Header{Name: member(i), Mode: 0o600, Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := bw.Flush(); err != nil {
		t.Fatal(err)
	}
}

func truncateMsg(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// shimPID is the running shim's process ID.
func shimPID(t testing.TB) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(node.env["NODE_RUN"], "cri-shim.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// procStatusKiB is field (VmRSS, VmHWM...) of process pid's status, in KiB.
func procStatusKiB(t testing.TB, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == field+":" {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// rootEntries are the checkpoint root's entries but the test's own (named
// with prefix own).
func rootEntries(t testing.TB, own string) map[string]bool {
	t.Helper()
	ents, err := os.ReadDir(node.env["CHECKPOINTS"])
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), own) {
			out[e.Name()] = true
		}
	}
	return out
}

// diskUse is the disk use (allocated blocks) of the checkpoint root's
// entries but those whose names begin with own (the test's own copies).
func diskUse(t testing.TB, own string) int64 {
	t.Helper()
	var n int64
	for name := range rootEntries(t, own) {
		filepath.WalkDir(filepath.Join(node.env["CHECKPOINTS"], name), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			if fi, err := d.Info(); err == nil {
				if st, ok := fi.Sys().(*syscall.Stat_t); ok {
					n += st.Blocks * 512
				}
			}
			return nil
		})
	}
	return n
}

// lockedDownAPIPod is secretAPIPod as a locked-down container of user uid:
// every capability dropped, no privilege escalation, RuntimeDefault seccomp.
func lockedDownAPIPod(name, restoreFrom string, uid int64) *corev1.Pod {
	p := secretAPIPod(name, restoreFrom)
	no := false
	p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{
		RunAsUser:                &uid,
		AllowPrivilegeEscalation: &no,
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	return p
}
