package kubeapi

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/cri-shim/cri-shim/internal/config"
)

// apiRequest is what the fake API server saw of one request.
type apiRequest struct {
	method, path, query, contentType, body string
}

// fakeServer answers as the API server does, on the wire, for the calls of
// Resources: each response is the object the path names (with its kind),
// a watch streams one event, and /readyz says ok.
func fakeServer(t *testing.T) (*httptest.Server, func() []apiRequest) {
	var mu sync.Mutex
	var seen []apiRequest
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, apiRequest{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Get("Content-Type"), string(b)})
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		pod := `{"kind":"Pod","apiVersion":"v1","metadata":{"name":"a","namespace":"ns","uid":"uid-a"}}`
		switch {
		case r.URL.Path == "/readyz":
			_, _ = w.Write([]byte("ok"))
		case r.URL.Path == "/api/v1/nodes/node-1":
			_, _ = w.Write([]byte(`{"kind":"Node","apiVersion":"v1","metadata":{"name":"node-1"},"status":{"declaredFeatures":["F"]}}`))
		case r.URL.Path == "/api/v1/pods" && r.URL.Query().Get("watch") == "true":
			_, _ = w.Write([]byte(`{"type":"ADDED","object":` + pod + "}\n"))
		case r.URL.Path == "/api/v1/pods":
			_, _ = w.Write([]byte(`{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"7"},"items":[` + pod + `]}`))
		case strings.HasPrefix(r.URL.Path, "/api/v1/namespaces/ns/pods/a"):
			_, _ = w.Write([]byte(pod))
		case strings.HasPrefix(r.URL.Path, "/apis/events.k8s.io/v1/namespaces/ns/events"):
			_, _ = w.Write([]byte(`{"kind":"Event","apiVersion":"events.k8s.io/v1","metadata":{"name":"a.1","namespace":"ns"},"reason":"R"}`))
		case r.URL.Path == "/api/v1/namespaces/ns/pods/gone":
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`))
		default:
			w.WriteHeader(http.StatusTeapot)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, func() []apiRequest {
		mu.Lock()
		defer mu.Unlock()
		return append([]apiRequest(nil), seen...)
	}
}

// connectTo is a Client connected, through a kubeconfig, to srv.
func connectTo(t *testing.T, srv *httptest.Server) *Client {
	path := filepath.Join(t.TempDir(), "kubelet.conf")
	kc := "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: \"" + srv.URL + "\"}\n" +
		"users:\n- name: u\n  user: {token: t}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n"
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := New(config.KubernetesConfig{Kubeconfig: path, NodeName: "node-1", QPS: 50, Burst: 100}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	c.Connect(context.Background())
	return c
}

// Each call of Resources is the request client-go's typed clients make:
// verb, path, content type and body.
func TestResourcesRequests(t *testing.T) {
	srv, seen := fakeServer(t)
	c := connectTo(t, srv)
	ctx := context.Background()
	res := c.Resources()
	if err := c.Probe(ctx); err != nil {
		t.Fatalf("probe: %v", err)
	}
	n, err := res.GetNode(ctx, "node-1")
	if err != nil || len(n.Status.DeclaredFeatures) != 1 {
		t.Fatalf("node %+v, %v", n, err)
	}
	if p, err := res.GetPod(ctx, "ns", "a"); err != nil || p.UID != "uid-a" {
		t.Fatalf("pod %+v, %v", p, err)
	}
	sel := metav1.ListOptions{FieldSelector: "spec.nodeName=node-1"}
	if l, err := res.ListPods(ctx, sel); err != nil || len(l.Items) != 1 || l.ResourceVersion != "7" {
		t.Fatalf("pods %+v, %v", l, err)
	}
	wi, err := res.WatchPods(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	if ev := <-wi.ResultChan(); ev.Type != watch.Added || ev.Object.(*corev1.Pod).Name != "a" {
		t.Fatalf("watch event %+v", ev)
	}
	wi.Stop()
	if err := res.PatchPodStatus(ctx, "ns", "a", []byte(`{"status":{}}`)); err != nil {
		t.Fatal(err)
	}
	ev := &eventsv1.Event{ObjectMeta: metav1.ObjectMeta{Name: "a.1", Namespace: "ns"}, Reason: "R"}
	if out, err := res.CreateEvent(ctx, ev); err != nil || out.Reason != "R" {
		t.Fatalf("event %+v, %v", out, err)
	}
	if _, err := res.PatchEvent(ctx, "ns", "a.1", []byte(`{"series":{"count":2}}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := res.GetPod(ctx, "ns", "gone"); !apierrors.IsNotFound(err) || Retryable(err) {
		t.Fatalf("missing pod: %v (want a NotFound, not retryable)", err)
	}

	// Every request but the watch carries the client's timeout (requestTimeout):
	// a watch ends with its context or the server's timeoutSeconds.
	want := []apiRequest{
		{method: "GET", path: "/readyz"},
		{method: "GET", path: "/api/v1/nodes/node-1"},
		{method: "GET", path: "/api/v1/namespaces/ns/pods/a"},
		{method: "GET", path: "/api/v1/pods", query: "fieldSelector=spec.nodeName%3Dnode-1&timeout=15s"},
		{method: "GET", path: "/api/v1/pods", query: "fieldSelector=spec.nodeName%3Dnode-1&watch=true"},
		{method: "PATCH", path: "/api/v1/namespaces/ns/pods/a/status", contentType: "application/strategic-merge-patch+json", body: `{"status":{}}`},
		{method: "POST", path: "/apis/events.k8s.io/v1/namespaces/ns/events", contentType: "application/json"},
		{method: "PATCH", path: "/apis/events.k8s.io/v1/namespaces/ns/events/a.1", contentType: "application/strategic-merge-patch+json", body: `{"series":{"count":2}}`},
		{method: "GET", path: "/api/v1/namespaces/ns/pods/gone"},
	}
	got := seen()
	if len(got) != len(want) {
		t.Fatalf("%d requests, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		g := got[i]
		if w.query == "" {
			w.query = "timeout=15s"
		}
		if g.method != w.method || g.path != w.path || g.query != w.query ||
			(w.contentType != "" && g.contentType != w.contentType) || (w.body != "" && g.body != w.body) {
			t.Errorf("request %d: %+v, want %+v", i, g, w)
		}
	}
	var posted eventsv1.Event
	if err := json.Unmarshal([]byte(got[6].body), &posted); err != nil || posted.Kind != "Event" ||
		posted.APIVersion != "events.k8s.io/v1" || posted.Reason != "R" {
		t.Fatalf("posted event %s: %+v, %v", got[6].body, posted, err)
	}
}

// A watch lives past the config's request timeout: client-go applies that
// timeout to the whole HTTP exchange, which would cut every watch after it
// and have the informers re-open them over and over.
func TestWatchOutlivesRequestTimeout(t *testing.T) {
	pod := func(name string) string {
		return `{"type":"ADDED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"` + name + `","namespace":"ns"}}}` + "\n"
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(pod("first")))
		w.(http.Flusher).Flush()
		select {
		case <-time.After(600 * time.Millisecond):
		case <-r.Context().Done():
			return
		}
		_, _ = w.Write([]byte(pod("second")))
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	defer srv.Close()
	res, err := newRESTResources(&rest.Config{Host: srv.URL, Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wi, err := res.WatchPods(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer wi.Stop()
	for _, want := range []string{"first", "second"} {
		select {
		case ev, ok := <-wi.ResultChan():
			if !ok || ev.Type != watch.Added || ev.Object.(*corev1.Pod).Name != want {
				t.Fatalf("watch gave %+v (open %v), want %s added", ev, ok, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no %s event", want)
		}
	}
}

// Every client the shim makes from its configuration (the core, watch and
// events clients here, the PodCheckpoint clients from REST()) draws on one
// token bucket: [kubernetes] qps and burst bound the process, not each
// client.
func TestOneRateLimiterPerProcess(t *testing.T) {
	srv, _ := fakeServer(t)
	c := connectTo(t, srv)
	want := c.REST().RateLimiter
	if want == nil {
		t.Fatal("the configuration has no rate limiter of its own: each client would make one")
	}
	if q := want.QPS(); q != 50 {
		t.Errorf("limiter QPS %v, want the configured 50", q)
	}
	r := c.Resources().(*restResources)
	other, err := rest.RESTClientFor(func() *rest.Config {
		cfg := rest.CopyConfig(c.REST())
		cfg.GroupVersion, cfg.APIPath = &corev1.SchemeGroupVersion, "/api"
		cfg.NegotiatedSerializer = scheme.Codecs.WithoutConversion()
		return cfg
	}())
	if err != nil {
		t.Fatal(err)
	}
	for name, cl := range map[string]rest.Interface{"core": r.core, "watch": r.coreWatch, "events": r.events, "a client from REST()": other} {
		if got := cl.(*rest.RESTClient).GetRateLimiter(); got != want {
			t.Errorf("%s client has a rate limiter of its own", name)
		}
	}
}
