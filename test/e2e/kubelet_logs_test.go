package e2e

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Issue 27's acceptance: `kubectl logs` shows the restored process's output.
// kubectl logs asks the API server for the pod's log subresource, which the
// API server reads from the kubelet of the pod's node at
// /containerLogs/NAMESPACE/POD/CONTAINER. On the test stack the API server
// cannot reach a kubelet: it dials the node's Hostname address (the node's
// name, which no resolver knows) and the kubelets listen on 127.0.0.1 only
// (test/stack/up.sh), where a node's InternalIP cannot point. The tests
// read that endpoint of the kubelet themselves, with kubectl's query: what
// kubectl logs --timestamps would print.

// kubeletLogs is what `kubectl logs --timestamps -c c` of pod ns/pod prints,
// read from the kubelet of the node whose env is env: each line's time and
// text.
func kubeletLogs(t testing.TB, env map[string]string, ns, pod, c string) ([]logLine, error) {
	t.Helper()
	u := fmt.Sprintf("https://127.0.0.1:%s/containerLogs/%s/%s/%s?timestamps=true", env["KUBELET_PORT"],
		url.PathEscape(ns), url.PathEscape(pod), url.PathEscape(c))
	resp, err := kubeletHTTP.Get(u)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %s", u, resp.Status, lastLines(string(b), 3))
	}
	var out []logLine
	for _, l := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		if l == "" {
			continue
		}
		ts, text, ok := strings.Cut(l, " ")
		at, err := time.Parse(time.RFC3339Nano, ts)
		if !ok || err != nil {
			return nil, fmt.Errorf("GET %s: a line without its time: %q", u, l)
		}
		out = append(out, logLine{at: at, text: text})
	}
	return out, nil
}

// podLogShowsSecret waits until the kubelet's log of main of the restored
// pod ns/pod (secretAPIPod, on node 1) shows the checkpointed process going
// on: lines of its secret (a process started anew makes up another)
// counting past past, the source's counter once its checkpoint was taken
// (-1 when the test does not know it), and past the count the log showed
// first, so that the log copied from the checkpoint does not pass for it. No
// line may carry another secret.
func podLogShowsSecret(t testing.TB, ns, pod, secret string, past int) {
	t.Helper()
	maxN := func() (int, error) {
		lines, err := kubeletLogs(t, node.env, ns, pod, "main")
		if err != nil {
			return -1, err
		}
		n := -1
		for _, l := range lines {
			m := secretLine.FindStringSubmatch(l.text)
			if m == nil {
				continue
			}
			if m[1] != secret {
				t.Fatalf("kubelet's log of %s/%s: secret %s, the checkpointed process's is %s: %q", ns, pod, m[1], secret, l.text)
			}
			n, _ = strconv.Atoi(m[2])
		}
		return n, nil
	}
	var first, last int
	eventually(t, 30*time.Second, "the kubelet's log of "+ns+"/"+pod, func() (err error) {
		first, err = maxN()
		return err
	})
	eventually(t, 30*time.Second, fmt.Sprintf("the kubelet's log of %s/%s counting past %d and %d with the source's secret", ns, pod, past, first), func() (err error) {
		if last, err = maxN(); err == nil && (last <= first || last <= past) {
			err = fmt.Errorf("at %d", last)
		}
		return err
	})
	t.Logf("kubelet's log of %s/%s main (kubectl logs): secret %s…, counting on from %d to %d (source past %d at its checkpoint)", ns, pod, secret[:6], first, last, past)
}

// podLogShowsCounter waits until the log of container c of the restored pod
// ns/pod (a counter) from the kubelet of the node whose env is env shows the
// checkpointed process going on: the first count logged after since (the
// restore) is at least before (the source's count before its checkpoint),
// and the counts go on past past (the source's count once its checkpoint
// was taken), one by one.
func podLogShowsCounter(t testing.TB, env map[string]string, ns, pod, c string, since time.Time, before, past int) {
	t.Helper()
	var first, last int
	eventually(t, 30*time.Second, fmt.Sprintf("the kubelet's log of %s/%s %s counting past %d", ns, pod, c, past), func() error {
		lines, err := kubeletLogs(t, env, ns, pod, c)
		if err != nil {
			return err
		}
		first, last = -1, -1
		for _, l := range lines {
			n, err := strconv.Atoi(strings.TrimSpace(l.text))
			if err != nil || !l.at.After(since) {
				continue
			}
			if first < 0 {
				first = n
			} else if n != last+1 {
				t.Fatalf("kubelet's log of %s/%s %s: the restored count jumps from %d to %d", ns, pod, c, last, n)
			}
			last = n
		}
		if last <= past {
			return fmt.Errorf("counts after the restore: first %d, last %d", first, last)
		}
		return nil
	})
	if first < before {
		t.Errorf("kubelet's log of %s/%s %s: the first count after the restore is %d; the source was at %d before the checkpoint (started anew?)", ns, pod, c, first, before)
	}
	t.Logf("kubelet's log of %s/%s %s (kubectl logs): went on from %d to %d (source at %d before its checkpoint, %d after)", ns, pod, c, first, last, before, past)
}
