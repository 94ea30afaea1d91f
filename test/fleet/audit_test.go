package fleet

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"
)

// auditEvent is what the harness reads of an audit.k8s.io/v1 Event.
type auditEvent struct {
	AuditID    string `json:"auditID"`
	Stage      string `json:"stage"`
	Verb       string `json:"verb"`
	RequestURI string `json:"requestURI"`
	UserAgent  string `json:"userAgent"`
	User       struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	Received time.Time `json:"requestReceivedTimestamp"`
	Staged   time.Time `json:"stageTimestamp"`
}

// auditReader reads the API server's audit log from where it last stopped.
type auditReader struct {
	path string
	off  int64
}

// side is who on a node asked: the shim (user agent cri-shim/...) or the
// kubelet-like baseline.
type side int

const (
	shim side = iota
	kubelet
)

// counts are one side's requests in a phase.
type counts struct {
	perNode    map[string]int // non-watch requests by node
	byVerb     map[string]int // "verb resource[/sub]", non-watch
	lists      map[string]int // lists served by node, watch-lists included
	refused    map[string]int // lists and watch-lists the API server refused (429: not ready or overloaded), by node
	pcpLists   int            // of them, lists of PodCheckpoints
	watchDelta map[string]int // watches started minus ended, by node
	lastWatch  map[string]time.Time
	perSecond  map[int64]int           // requests and watch starts by second
	codes      map[int]int             // response codes >= 400
	statusAt   map[string][]time.Time  // pods/status patches by namespace/name
	conflicts  map[string]int          // 409 answers by node
	pcpStatus  map[string]int          // PodCheckpoint status writes the API server took, by node
	listLog    map[string][]*listEvent // each node's lists
	openLists  map[string]*listEvent   // watch-lists not ended yet, by audit ID
}

// listEvent is one list of a node: a LIST, or a watch-list (a list streamed
// through a watch), with when its stream ended and how.
type listEvent struct {
	res          string
	watch        bool
	start, ended time.Time
	code         int
}

func (l *listEvent) String() string {
	kind := "list"
	if l.watch {
		kind = "watch-list"
	}
	end := "open"
	if !l.ended.IsZero() {
		end = fmt.Sprintf("%d after %.1f s", l.code, l.ended.Sub(l.start).Seconds())
	}
	return fmt.Sprintf("%s %s at %s (%s)", kind, l.res, l.start.Format("15:04:05.0"), end)
}

func newCounts() *counts {
	return &counts{perNode: map[string]int{}, byVerb: map[string]int{}, lists: map[string]int{}, watchDelta: map[string]int{},
		lastWatch: map[string]time.Time{}, perSecond: map[int64]int{}, codes: map[int]int{}, statusAt: map[string][]time.Time{},
		conflicts: map[string]int{}, pcpStatus: map[string]int{}, listLog: map[string][]*listEvent{}, openLists: map[string]*listEvent{}, refused: map[string]int{}}
}

// phaseCounts is what one phase's requests of the simulated nodes were.
type phaseCounts struct {
	side         [2]*counts
	unscoped     []string // PodCheckpoint lists and watches of a node without its node selector
	leaseTooMany int      // 429 answers to the kubelet's lease writes
	routerLists  int      // the router's lists of PodCheckpoints served
	routerOpen   map[string]bool
}

func newPhaseCounts() phaseCounts {
	return phaseCounts{side: [2]*counts{newCounts(), newCounts()}, routerOpen: map[string]bool{}}
}

const routerUser = "system:serviceaccount:cri-shim-system:cri-shim-router"

func (a *auditReader) read(t testing.TB) phaseCounts {
	t.Helper()
	pc := newPhaseCounts()
	f, err := os.Open(a.path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Seek(a.off, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReaderSize(f, 1<<20)
	for {
		line, err := r.ReadBytes('\n')
		if len(line) == 0 || line[len(line)-1] != '\n' {
			break // a line still being written waits for the next read
		}
		a.off += int64(len(line))
		var e auditEvent
		if json.Unmarshal(line, &e) == nil {
			pc.add(e)
		}
		if err != nil {
			break
		}
	}
	return pc
}

func (pc *phaseCounts) add(e auditEvent) {
	node, isNode := strings.CutPrefix(e.User.Username, "system:node:")
	if !isNode {
		if e.User.Username != routerUser || e.ObjectRef == nil || e.ObjectRef.Resource != "podcheckpoints" {
			return
		}
		switch {
		case e.Verb == "list" && e.Stage == "ResponseComplete" && !refused(e):
			pc.routerLists++
		case e.Verb == "watch" && e.Stage == "ResponseStarted" && strings.Contains(e.RequestURI, "sendInitialEvents=true"):
			pc.routerLists++
			pc.routerOpen[e.AuditID] = true
		case e.Verb == "watch" && e.Stage == "ResponseComplete" && pc.routerOpen[e.AuditID]:
			delete(pc.routerOpen, e.AuditID)
			if refused(e) {
				pc.routerLists--
			}
		}
		return
	}
	c := pc.side[kubelet]
	if strings.HasPrefix(e.UserAgent, "cri-shim/") {
		c = pc.side[shim]
	}
	res := ""
	if e.ObjectRef != nil {
		res = e.ObjectRef.Resource
		if e.ObjectRef.Subresource != "" {
			res += "/" + e.ObjectRef.Subresource
		}
	}
	if e.ObjectRef == nil {
		res = strings.SplitN(e.RequestURI, "?", 2)[0] // a non-resource path (/readyz)
	}
	if e.Verb == "watch" {
		switch e.Stage {
		case "ResponseStarted":
			c.watchDelta[node]++
			if strings.Contains(e.RequestURI, "sendInitialEvents=true") {
				c.lists[node]++ // a list streamed through the watch (client-go's watch-list)
				l := &listEvent{res: res, watch: true, start: e.Received}
				c.listLog[node] = append(c.listLog[node], l)
				c.openLists[e.AuditID] = l
				if res == "podcheckpoints" {
					c.pcpLists++
				}
			}
			c.perSecond[e.Received.Unix()]++
			if e.Received.After(c.lastWatch[node]) {
				c.lastWatch[node] = e.Received
			}
			pc.checkScope(node, e, res)
		case "ResponseComplete", "Panic":
			c.watchDelta[node]--
			if l := c.openLists[e.AuditID]; l != nil {
				l.ended = e.Staged
				if e.ResponseStatus != nil {
					l.code = e.ResponseStatus.Code
				}
				delete(c.openLists, e.AuditID)
				if refused(e) {
					// Counted as a list when it started: it sent nothing.
					c.lists[node]--
					c.refused[node]++
					if res == "podcheckpoints" {
						c.pcpLists--
					}
				}
			}
		}
		return
	}
	if e.Stage != "ResponseComplete" {
		return
	}
	c.perNode[node]++
	c.byVerb[e.Verb+" "+res]++
	c.perSecond[e.Received.Unix()]++
	if e.Verb == "list" {
		l := &listEvent{res: res, start: e.Received, ended: e.Staged}
		if e.ResponseStatus != nil {
			l.code = e.ResponseStatus.Code
		}
		c.listLog[node] = append(c.listLog[node], l)
		switch {
		case refused(e):
			c.refused[node]++
		case res == "podcheckpoints":
			c.pcpLists++
			fallthrough
		default:
			c.lists[node]++
		}
		pc.checkScope(node, e, res)
	}
	if e.ResponseStatus != nil && e.ResponseStatus.Code >= 400 {
		c.codes[e.ResponseStatus.Code]++
		if e.ResponseStatus.Code == 429 && res == "leases" {
			pc.leaseTooMany++
		}
		if e.ResponseStatus.Code == 409 {
			c.conflicts[node]++
		}
	}
	if res == "podcheckpoints/status" && e.ResponseStatus != nil && e.ResponseStatus.Code < 300 {
		c.pcpStatus[node]++
	}
	if res == "pods/status" && e.ObjectRef != nil {
		k := e.ObjectRef.Namespace + "/" + e.ObjectRef.Name
		c.statusAt[k] = append(c.statusAt[k], e.Received)
	}
}

// checkScope records a PodCheckpoint list or watch of node that selects by
// neither its status.nodeName nor its routing label.
func (pc *phaseCounts) checkScope(node string, e auditEvent, res string) {
	if res != "podcheckpoints" {
		return
	}
	u, err := url.Parse(e.RequestURI)
	if err != nil {
		pc.unscoped = append(pc.unscoped, e.RequestURI)
		return
	}
	q := u.Query()
	if q.Get("fieldSelector") == "status.nodeName="+node || q.Get("labelSelector") == "checkpoint.cri-shim.io/node="+node {
		return
	}
	pc.unscoped = append(pc.unscoped, e.RequestURI)
}

// refused says whether the API server answered a list or watch with an
// error status (429 while its watch cache is not ready, or overloaded):
// nothing was listed.
func refused(e auditEvent) bool {
	return e.ResponseStatus != nil && e.ResponseStatus.Code >= 400
}
