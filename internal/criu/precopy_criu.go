package criu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"time"

	gocriu "github.com/checkpoint-restore/go-criu/v8"
	"github.com/checkpoint-restore/go-criu/v8/rpc"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

// MemTrackAvailable asks CRIU (criu, a path or a name on PATH) whether it
// and the kernel track dirty pages: the FEATURE_CHECK request of CRIU's RPC
// with mem_track set, which is what 'criu check --feature mem_dirty_track'
// reports on the command line.
//
// It speaks the RPC itself, with go-criu's message types, rather than call
// go-criu's Criu.FeatureCheck: that one (v7.2.0, features.go) returns the
// features it was given instead of the ones in CRIU's answer, so it would
// report tracking on a kernel without it.
func MemTrackAvailable(ctx context.Context, criu string) (bool, error) {
	resp, err := criuRPC(ctx, criu, &rpc.CriuReq{
		Type:     rpc.CriuReqType_FEATURE_CHECK.Enum(),
		Features: &rpc.CriuFeatures{MemTrack: proto.Bool(true)},
	})
	if err != nil {
		return false, err
	}
	if resp.GetType() != rpc.CriuReqType_FEATURE_CHECK || !resp.GetSuccess() {
		return false, fmt.Errorf("criu feature check: unexpected answer (type %s, success %t, errno %d, %s)",
			resp.GetType(), resp.GetSuccess(), resp.GetCrErrno(), resp.GetCrErrmsg())
	}
	return resp.GetFeatures().GetMemTrack(), nil
}

// criuRPC runs "criu swrk" for one request and returns CRIU's answer. It
// returns by ctx's deadline whatever CRIU does: killing "criu swrk" is not
// enough, since CRIU answers some requests (a feature check) from a forked
// child that holds the socket too, so the shim's end is non-blocking, read
// with a deadline from ctx, and cut off when ctx ends.
func criuRPC(ctx context.Context, criu string, req *rpc.CriuReq) (*rpc.CriuResp, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	// CRIU's end blocks, as CRIU expects; the shim's end goes to Go's
	// poller (os.NewFile of a non-blocking descriptor), which gives it
	// deadlines.
	if err := unix.SetNonblock(fds[1], false); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, err
	}
	cln, srv := os.NewFile(uintptr(fds[0]), "criu-client"), os.NewFile(uintptr(fds[1]), "criu-server")
	defer cln.Close()
	if d, ok := ctx.Deadline(); ok {
		if err := cln.SetDeadline(d); err != nil {
			srv.Close()
			return nil, fmt.Errorf("criu swrk: the socket takes no deadline: %w", err)
		}
	}
	stop := context.AfterFunc(ctx, func() { _ = cln.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	cmd := exec.CommandContext(ctx, criu, "swrk", "3")
	cmd.ExtraFiles = []*os.File{srv} // fd 3 in CRIU
	err = cmd.Start()
	srv.Close()
	if err != nil {
		return nil, fmt.Errorf("criu swrk: %w", err)
	}
	resp, err := func() (*rpc.CriuResp, error) {
		b, err := req.MarshalVT()
		if err != nil {
			return nil, err
		}
		if _, err := cln.Write(b); err != nil {
			return nil, err
		}
		buf := make([]byte, 1<<16)
		n, err := cln.Read(buf)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				cause := ctx.Err()
				if cause == nil { // the socket's deadline fired just before ctx's
					cause = context.DeadlineExceeded
				}
				err = fmt.Errorf("no answer: %w", cause)
			}
			return nil, err
		}
		var resp rpc.CriuResp
		if err := resp.UnmarshalVT(buf[:n]); err != nil {
			return nil, err
		}
		return &resp, nil
	}()
	cln.Close() // CRIU's service loop ends when the socket closes
	werr := cmd.Wait()
	if err != nil {
		return nil, fmt.Errorf("criu swrk: %w", errors.Join(err, werr))
	}
	return resp, nil
}

// CRIUPreDumper pre-dumps a container's process tree through go-criu
// (PRE_DUMP over CRIU's RPC), on the init PID containerd reports. It runs
// CRIU itself, not through runc or containerd: containerd's task API has no
// pre-dump (its runc shim only ever adds runc's --leave-running to a
// checkpoint, cmd/containerd-shim-runc-v2/process/init.go, (*Init).checkpoint).
// A pre-dump writes memory pages only: no files, mounts or namespaces are
// dumped, so none of runc's container-specific CRIU options are needed for it.
type CRIUPreDumper struct {
	// CRIU is the criu binary (a name on PATH, or a path).
	CRIU string
	// Pid returns the host PID of the container's init process.
	Pid func(ctx context.Context, id string) (int, error)
}

// PreDump copies the container's memory into dir, leaves the processes
// running, and resets their dirty-page tracking.
func (p *CRIUPreDumper) PreDump(ctx context.Context, id, dir string) error {
	pid, err := p.Pid(ctx, id)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	c := gocriu.MakeCriu()
	if p.CRIU != "" {
		c.SetCriuPath(p.CRIU)
	}
	// CRIU opens the directory through /proc/<this pid>/fd/<fd>.
	if err := c.PreDump(preDumpOpts(int(d.Fd()), pid), nil); err != nil {
		return fmt.Errorf("criu pre-dump of pid %d (log: %s/%s): %w", pid, dir, preDumpLog, err)
	}
	return nil
}

// preDumpLog is CRIU's log of a pre-dump, in its image directory.
const preDumpLog = "pre-dump.log"

// preDumpOpts are CRIU's options for a pre-dump of the tree rooted at pid
// into the directory open as fd: track memory (the final dump with this
// directory as parent writes only pages dirtied since), log at level 4
// (runc's level) into the directory.
func preDumpOpts(fd, pid int) *rpc.CriuOpts {
	return &rpc.CriuOpts{
		ImagesDirFd: proto.Int32(int32(fd)),
		Pid:         proto.Int32(int32(pid)),
		TrackMem:    proto.Bool(true),
		LogLevel:    proto.Int32(4),
		LogFile:     proto.String(preDumpLog),
	}
}
