package capture

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"syscall"
)

// anyCaptureRunning returns a container of ids that containerd is still
// capturing.
func (s *Service) anyCaptureRunning(ids []string) (string, bool) {
	running := s.cfg.CaptureRunning
	if running == nil {
		running = procCaptureRunning
	}
	for _, id := range ids {
		if running(id) {
			return id, true
		}
	}
	return "", false
}

// procCaptureRunning reports whether a runc checkpoint of container id is
// running on this host. containerd's runc shim runs it as
// "runc [global flags] checkpoint [flags] <id>" (go-runc's Checkpoint, which
// puts the container ID last) and waits for CRIU under it, so the runc process
// lives exactly as long as the capture.
func procCaptureRunning(id string) bool {
	procs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		return false
	}
	for _, p := range procs {
		// Only root's processes: any user can name a process "runc" and
		// give it a container ID, which would stall a resume.
		if fi, err := os.Stat(filepath.Dir(p)); err != nil || !ownedByRoot(fi) {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil || len(b) == 0 {
			continue
		}
		if isRuncCheckpoint(bytes.Split(bytes.TrimRight(b, "\x00"), []byte{0}), id) {
			return true
		}
	}
	return false
}

func ownedByRoot(fi os.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && st.Uid == 0
}

// isRuncCheckpoint reports whether argv is a runc checkpoint of container id.
func isRuncCheckpoint(argv [][]byte, id string) bool {
	if len(argv) < 3 || filepath.Base(string(argv[0])) != "runc" || string(argv[len(argv)-1]) != id {
		return false
	}
	return slices.ContainsFunc(argv[1:len(argv)-1], func(a []byte) bool { return string(a) == "checkpoint" })
}
