package ociartifact

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/cri-shim/cri-shim/internal/kubeapi/kubeapitest"
)

// secretGets counts the secret GETs the fake API server answers, by name.
func secretGets(cs interface {
	PrependReactor(verb, resource string, f k8stesting.ReactionFunc)
}) func() map[string]int {
	var mu sync.Mutex
	gets := map[string]int{}
	cs.PrependReactor("get", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		gets[a.(k8stesting.GetAction).GetName()]++
		mu.Unlock()
		return false, nil, nil
	})
	return func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		out := map[string]int{}
		for k, v := range gets {
			out[k] = v
		}
		return out
	}
}

// A pod naming thousands of pull secrets, repeated ones among them, costs
// at most maxPullSecrets GETs, one per distinct name, in the spec's order;
// the credentials of a secret listed beyond them are not used.
func TestPodKeychainDedupesAndCapsSecrets(t *testing.T) {
	cs := podAPI(t, dockerSecret("first", "127.0.0.1:5000", "u", "p"), dockerSecret("late", "reg.example", "l", "x"))
	pod, err := cs.CoreV1().Pods("default").Get(context.Background(), "web", metav1.GetOptions{})
	must(t, err)
	refs := []corev1.LocalObjectReference{{Name: "first"}, {Name: "first"}, {Name: ""}}
	for i := range 3000 {
		refs = append(refs, corev1.LocalObjectReference{Name: fmt.Sprintf("missing-%d", i%(2*maxPullSecrets))})
	}
	pod.Spec.ImagePullSecrets = append(refs, corev1.LocalObjectReference{Name: "late"})
	_, err = cs.CoreV1().Pods("default").Update(context.Background(), pod, metav1.UpdateOptions{})
	must(t, err)
	gets := secretGets(cs)
	kc, err := PodKeychain(context.Background(), kubeapitest.Clientset{Interface: cs}, nil, "n1", "default", "web", "uid-new", discard())
	must(t, err)
	got := gets()
	total := 0
	for name, n := range got {
		total += n
		if n != 1 {
			t.Errorf("secret %s read %d times", name, n)
		}
	}
	if total != maxPullSecrets || got["first"] != 1 || got["missing-0"] != 1 || got[fmt.Sprintf("missing-%d", maxPullSecrets-2)] != 1 || got["late"] != 0 {
		t.Fatalf("%d secret GETs %v; want %d: first, then missing-0..missing-%d", total, got, maxPullSecrets, maxPullSecrets-2)
	}
	if a := resolve(t, kc, "127.0.0.1:5000/cp/web"); a.Username != "u" {
		t.Errorf("first's credentials not used: %+v", a)
	}
	if a := resolve(t, kc, "reg.example/cp"); a.Username != "" {
		t.Errorf("a secret beyond the cap was used: %+v", a)
	}
}

// A SecretCache answers the same secret, found or missing, within its TTL
// without a GET, and reads it again after.
func TestSecretCacheTTL(t *testing.T) {
	cs := podAPI(t, dockerSecret("first", "127.0.0.1:5000", "u", "p"))
	gets := secretGets(cs)
	c := NewSecretCache()
	now := time.Unix(1000, 0)
	c.now = func() time.Time { return now }
	res := kubeapitest.Clientset{Interface: cs}
	for range 5 {
		_, err := PodKeychain(context.Background(), res, c, "n1", "default", "web", "uid-new", discard())
		must(t, err)
	}
	if g := gets(); g["first"] != 1 || g["missing"] != 1 {
		t.Fatalf("GETs within the TTL: %v, want one each of first and missing", g)
	}
	now = now.Add(secretTTL)
	_, err := PodKeychain(context.Background(), res, c, "n1", "default", "web", "uid-new", discard())
	must(t, err)
	if g := gets(); g["first"] != 2 || g["missing"] != 2 {
		t.Fatalf("GETs after the TTL: %v, want two each", g)
	}
}

// A failure to reach the API server is not remembered.
func TestSecretCacheSkipsTransportFailures(t *testing.T) {
	cs := podAPI(t, dockerSecret("first", "127.0.0.1:5000", "u", "p"))
	fail := true
	cs.PrependReactor("get", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
		if fail {
			return true, nil, fmt.Errorf("connection refused")
		}
		return false, nil, nil
	})
	c := NewSecretCache()
	res := kubeapitest.Clientset{Interface: cs}
	if _, err := c.get(context.Background(), res, "default", "first"); err == nil {
		t.Fatal("want the transport failure")
	}
	fail = false
	if s, err := c.get(context.Background(), res, "default", "first"); err != nil || s.Name != "first" {
		t.Fatalf("after the server came back: %v, %v", s, err)
	}
}
