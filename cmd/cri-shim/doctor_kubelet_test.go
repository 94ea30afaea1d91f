package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const testShimSock = "/run/cri-shim/cri-shim.sock"

// fakeNode is a root with files and a proc directory with processes, each
// process's root and cwd linking to the root, as /proc/PID/root does.
type fakeNode struct {
	t          *testing.T
	proc, root string
}

func newFakeNode(t *testing.T) fakeNode {
	d := t.TempDir()
	n := fakeNode{t, filepath.Join(d, "proc"), filepath.Join(d, "root")}
	for _, p := range []string{n.proc, n.root} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

func (n fakeNode) file(rel, body string) {
	p := filepath.Join(n.root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		n.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		n.t.Fatal(err)
	}
}

func (n fakeNode) process(pid int, comm string, args ...string) {
	d := filepath.Join(n.proc, strconv.Itoa(pid))
	if err := os.MkdirAll(d, 0o755); err != nil {
		n.t.Fatal(err)
	}
	os.WriteFile(filepath.Join(d, "comm"), []byte(comm+"\n"), 0o644)
	os.WriteFile(filepath.Join(d, "cmdline"), []byte(strings.Join(args, "\x00")+"\x00"), 0o644)
	os.Symlink(n.root, filepath.Join(d, "root"))
	os.Symlink("/var/lib/kubelet", filepath.Join(d, "cwd"))
}

// The running kubelet's endpoint, from its command line and the files it
// names, in the kubelet's order: a flag wins, drop-ins (lexical, in
// subdirectories too) over the --config file, the default when none names
// one; a null in a later file puts the default back.
func TestCheckKubeletRunning(t *testing.T) {
	const containerd = "containerRuntimeEndpoint: unix:///run/containerd/containerd.sock\n"
	const shim = "containerRuntimeEndpoint: unix://" + testShimSock + "\n"
	for _, c := range []struct {
		name  string
		files map[string]string
		args  []string
		want  level
		has   string
	}{
		{"config file on containerd", map[string]string{"var/lib/kubelet/config.yaml": containerd},
			[]string{"--config=/var/lib/kubelet/config.yaml"}, fail, "does not use the shim's socket"},
		{"no file names one: the default", nil, []string{"--v=2"}, fail, "the kubelet's default"},
		{"drop-in on the shim", map[string]string{"var/lib/kubelet/config.yaml": containerd, "etc/kubernetes/kubelet.conf.d/50-cri-shim.conf": shim},
			[]string{"--config", "/var/lib/kubelet/config.yaml", "--config-dir=/etc/kubernetes/kubelet.conf.d"}, ok, "50-cri-shim.conf"},
		{"drop-in written but no --config-dir", map[string]string{"var/lib/kubelet/config.yaml": containerd, "etc/kubernetes/kubelet.conf.d/50-cri-shim.conf": shim},
			[]string{"--config=/var/lib/kubelet/config.yaml"}, fail, "config.yaml"},
		{"a later drop-in puts containerd back", map[string]string{"etc/kubernetes/kubelet.conf.d/50-cri-shim.conf": shim, "etc/kubernetes/kubelet.conf.d/sub/90-x.conf": containerd},
			[]string{"--config-dir=/etc/kubernetes/kubelet.conf.d"}, fail, "90-x.conf"},
		{"null resets to the default", map[string]string{"etc/kubernetes/kubelet.conf.d/50-cri-shim.conf": shim, "etc/kubernetes/kubelet.conf.d/60-null.conf": "containerRuntimeEndpoint: null\n"},
			[]string{"--config-dir=/etc/kubernetes/kubelet.conf.d"}, fail, "containerd.sock"},
		{"a flag wins over the drop-in", map[string]string{"etc/kubernetes/kubelet.conf.d/50-cri-shim.conf": shim},
			[]string{"--config-dir=/etc/kubernetes/kubelet.conf.d", "--container-runtime-endpoint=unix:///run/containerd/containerd.sock"}, fail, "command line"},
		{"the flag on the shim, as /var/run", nil, []string{"--container-runtime-endpoint", "unix:///var/run/cri-shim/cri-shim.sock"}, ok, "command line"},
		{"relative --config from the kubelet's cwd", map[string]string{"var/lib/kubelet/config.yaml": shim}, []string{"--config=config.yaml"}, ok, "config.yaml"},
		{"images elsewhere", map[string]string{"c.yaml": shim + "imageServiceEndpoint: unix:///run/containerd/containerd.sock\n"}, []string{"--config=/c.yaml"}, warn, "pulls images"},
		{"JSON drop-in", map[string]string{"d/1.conf": `{"containerRuntimeEndpoint": "unix://` + testShimSock + `"}`}, []string{"--config-dir=/d"}, ok, "1.conf"},
		{"unreadable config", map[string]string{"c.yaml": "{{{"}, []string{"--config=/c.yaml"}, fail, "not a kubelet configuration"},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := newFakeNode(t)
			for rel, body := range c.files {
				n.file(rel, body)
			}
			n.process(1, "systemd", "/sbin/init")
			n.process(4242, "kubelet", append([]string{"/usr/bin/kubelet"}, c.args...)...)
			f := checkKubelet(n.proc, n.root, "unix://"+testShimSock)
			if f.level != c.want || !strings.Contains(f.detail, c.has) {
				t.Errorf("%v %q, want %v containing %q", f.level, f.detail, c.want, c.has)
			}
		})
	}
}

// Several kubelets (a test bed): one on the shim passes; none running falls
// back to the files and at most warns.
func TestCheckKubeletProcesses(t *testing.T) {
	n := newFakeNode(t)
	n.file("a.yaml", "containerRuntimeEndpoint: unix:///run/other.sock\n")
	n.file("b.yaml", "containerRuntimeEndpoint: unix://"+testShimSock+"\n")
	n.process(10, "kubelet", "kubelet", "--config=/a.yaml")
	n.process(11, "kubelet", "kubelet", "--config=/b.yaml")
	if f := checkKubelet(n.proc, n.root, testShimSock); f.level != ok || !strings.Contains(f.detail, "pid 11") {
		t.Errorf("two kubelets, one on the shim: %+v", f)
	}
	n2 := newFakeNode(t)
	n2.file("var/lib/kubelet/config.yaml", "containerRuntimeEndpoint: unix:///run/containerd/containerd.sock\n")
	if f := checkKubelet(n2.proc, n2.root, testShimSock); f.level != warn || !strings.Contains(f.detail, "no kubelet running") {
		t.Errorf("no kubelet: %+v", f)
	}
}

// A kubelet's command line and files are the node's: any content gives a
// finding, never a crash.
func FuzzKubeletArgsEndpoints(f *testing.F) {
	f.Add("--config=/c\x00--config-dir\x00/d", "containerRuntimeEndpoint: [1]\n")
	f.Add("--container-runtime-endpoint", "imageServiceEndpoint: 5\n")
	f.Fuzz(func(t *testing.T, cmdline, conf string) {
		n := newFakeNode(t)
		n.file("c", conf)
		n.file("d/x.conf", conf)
		n.process(7, "kubelet", append([]string{"kubelet"}, strings.Split(cmdline, "\x00")...)...)
		if f := checkKubelet(n.proc, n.root, testShimSock); f.name != "kubelet" || f.detail == "" {
			t.Fatalf("no finding: %+v", f)
		}
	})
}
