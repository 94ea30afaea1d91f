package podspec

import (
	"strings"
	"testing"
)

func TestParseOrchestrator(t *testing.T) {
	d, p := ParseOrchestrator(map[string]string{PodManagementPrefix + "orch": `{"port": 50051, "version": "1.0"}`, "other": "x"})
	if len(p) != 0 || d == nil || d.Container != "orch" || d.Port != 50051 {
		t.Fatalf("%+v %v", d, p)
	}
	for v, want := range map[string]string{
		`{"port": 0, "version": "1.0"}`:                   "port 0",
		`{"port": 70000, "version": "1.0"}`:               "port 70000",
		`{"port": 1, "version": "2.0"}`:                   `version "2.0"`,
		`{"port": 1, "version": "1.0", "x": 1}`:           "unknown field",
		`{"port": 1, "version": "1.0", "container": "x"}`: "unknown field",
		`{"port": "1"}`:                                   "want",
		`nope`:                                            "want",
		`{"port": 1, "version": "1.0"} {}`:                "trailing",
	} {
		d, p := ParseOrchestrator(map[string]string{PodManagementPrefix + "orch": v})
		if d != nil || len(p) != 1 || !strings.Contains(p[0], want) {
			t.Errorf("%s: %+v %v, want a problem mentioning %q", v, d, p, want)
		}
	}
	if d, p := ParseOrchestrator(map[string]string{PodManagementPrefix + "a": `{"port":1,"version":"1.0"}`, PodManagementPrefix + "b": `{"port":2,"version":"1.0"}`}); d != nil || len(p) != 1 {
		t.Errorf("two declarations: %+v %v", d, p)
	}
}

func FuzzParseOrchestrator(f *testing.F) {
	f.Add("orch", `{"port": 50051, "version": "1.0"}`)
	f.Add("", `{}`)
	f.Fuzz(func(t *testing.T, name, v string) {
		d, _ := ParseOrchestrator(map[string]string{PodManagementPrefix + name: v})
		if d != nil && (d.Port < 1 || d.Port > 65535 || d.Version != "1.0" || d.Container == "") {
			t.Fatalf("accepted %+v", d)
		}
	})
}
