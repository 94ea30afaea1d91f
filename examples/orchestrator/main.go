// Command orchestrator is an example orchestrator sidecar for cri-shim's pod
// management channel (KEP-5309). It serves the channel on --port, checks the
// node agent's token (pkg/podmanagement does), prints every container event it
// receives, and carries out commands written as lines to --commands:
//
//	terminate <container> <exit code>
//	restart <container>
//	restart-all <reason>
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	pb "github.com/cri-shim/cri-shim/api/podmanagement/v1"
	"github.com/cri-shim/cri-shim/pkg/podmanagement"
)

func main() {
	port := flag.Int("port", 50051, "port to serve the pod management channel on")
	commands := flag.String("commands", "", "file to read command lines from (polled)")
	flag.Parse()
	log.SetFlags(log.Lmicroseconds)
	sc, err := podmanagement.New(podmanagement.Options{})
	if err != nil {
		log.Fatal(err)
	}
	lis, err := net.Listen("tcp", fmt.Sprintf(":%d", *port))
	if err != nil {
		log.Fatal(err)
	}
	go func() { log.Fatal(sc.Serve(lis)) }()
	log.Printf("orchestrator: serving pod management v%s on :%d", podmanagement.Version, *port)
	if *commands != "" {
		go follow(sc, *commands)
	}
	rejected := int64(0)
	for {
		select {
		case ev := <-sc.Events():
			fmt.Printf("event seq=%d container=%s type=%s exit=%d restarts=%d message=%q\n",
				ev.GetSequence(), ev.GetContainerName(), ev.GetType(), ev.GetExitCode(), ev.GetRestartCount(), ev.GetMessage())
		case <-time.After(time.Second):
		}
		if r := sc.Rejected(); r != rejected {
			fmt.Printf("rejected %d calls with a wrong or missing token\n", r-rejected)
			rejected = r
		}
	}
}

// follow reads new command lines from path as they are appended. How many
// it has carried out is kept in path+".done", so a restarted orchestrator
// does not repeat commands.
func follow(sc *podmanagement.Sidecar, path string) {
	done := 0
	if b, err := os.ReadFile(path + ".done"); err == nil {
		done, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	for {
		time.Sleep(100 * time.Millisecond)
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		var lines []string
		s := bufio.NewScanner(f)
		for s.Scan() {
			lines = append(lines, s.Text())
		}
		f.Close()
		for ; done < len(lines); done++ {
			_ = os.WriteFile(path+".done", []byte(strconv.Itoa(done+1)), 0o644)
			run(sc, strings.Fields(lines[done]))
		}
	}
}

func run(sc *podmanagement.Sidecar, f []string) {
	if len(f) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var r *pb.CommandResponse
	var err error
	switch {
	case f[0] == "terminate" && len(f) == 3:
		code, cerr := strconv.Atoi(f[2])
		if cerr != nil {
			fmt.Printf("command %q: bad exit code\n", strings.Join(f, " "))
			return
		}
		r, err = sc.Terminate(ctx, f[1], int32(code))
	case f[0] == "restart" && len(f) == 2:
		r, err = sc.Restart(ctx, f[1])
	case f[0] == "restart-all":
		r, err = sc.RestartAll(ctx, strings.Join(f[1:], " "))
	default:
		fmt.Printf("command %q: unknown\n", strings.Join(f, " "))
		return
	}
	if err != nil {
		fmt.Printf("command %q: %v\n", strings.Join(f, " "), err)
		return
	}
	fmt.Printf("command %q: %s %s\n", strings.Join(f, " "), r.GetResult(), r.GetErrorDescription())
}
