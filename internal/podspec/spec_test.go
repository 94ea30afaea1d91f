package podspec

import (
	"testing"
)

// Parse reads every key once: the valid ones into the Spec, each refused
// one into a Problem that names its key and feature.
func TestParse(t *testing.T) {
	good := `[{"action":"RestartAllContainers","exitCodes":{"operator":"In","values":[88]}}]`
	s := Parse(map[string]string{
		RestartRulesPrefix + "main":  good,
		RestartRulesPrefix + "side":  "nope",
		TerminationKey:               "Immediate",
		PodManagementPrefix + "orch": `{"port": 50051, "version": "1.0"}`,
		RestoreFromKey:               "cp-1",
		"unrelated":                  "x",
	})
	if len(s.Rules) != 1 || len(s.Rules["main"]) != 1 || s.Termination != TerminationGraceful ||
		s.Orchestrator == nil || s.Orchestrator.Container != "orch" || s.Orchestrator.Port != 50051 || s.RestoreFrom != "cp-1" {
		t.Fatalf("spec %+v", s)
	}
	want := []Problem{{FeatureRestart, RestartRulesPrefix + "side", ""}, {FeatureRestart, TerminationKey, ""}}
	if len(s.Problems) != len(want) {
		t.Fatalf("problems %+v", s.Problems)
	}
	for i, w := range want {
		if p := s.Problems[i]; p.Feature != w.Feature || p.Key != w.Key || p.Message == "" {
			t.Errorf("problem %d = %+v, want %s of %s", i, p, w.Feature, w.Key)
		}
	}

	// Two declarations: each valid alone, refused together under the prefix.
	s = Parse(map[string]string{PodManagementPrefix + "a": `{"port":1,"version":"1.0"}`, PodManagementPrefix + "b": `{"port":2,"version":"1.0"}`})
	if s.Orchestrator != nil || len(s.Problems) != 1 || s.Problems[0].Key != PodManagementPrefix+"*" || s.Problems[0].Feature != FeaturePodManagement {
		t.Fatalf("two orchestrators: %+v", s)
	}
	// A malformed one is named once, by its key.
	s = Parse(map[string]string{PodManagementPrefix + "a": `{"port":0,"version":"1.0"}`})
	if s.Orchestrator != nil || len(s.Problems) != 1 || s.Problems[0].Key != PodManagementPrefix+"a" {
		t.Fatalf("malformed orchestrator: %+v", s)
	}
	if s := Parse(nil); s.Termination != TerminationGraceful || s.Rules != nil || len(s.Problems) != 0 || Annotated(nil) {
		t.Fatalf("no annotations: %+v", s)
	}
}

// FuzzParse: any annotations parse without a panic, every problem names a
// key the pod has (or a prefix and "*"), and no problem repeats an
// unbounded part of a value.
func FuzzParse(f *testing.F) {
	f.Add(RestartRulesPrefix+"c", `[{"action":"Restart","exitCodes":{"operator":"In","values":[1]}}]`, PodManagementPrefix+"o", `{"port":1,"version":"1.0"}`)
	f.Add(TerminationKey, "x", PodManagementPrefix, "{")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string) {
		ann := map[string]string{k1: v1, k2: v2}
		s := Parse(ann)
		for _, p := range s.Problems {
			if _, ok := ann[p.Key]; !ok && p.Key != PodManagementPrefix+"*" {
				t.Fatalf("problem names %q, not a key of %v", p.Key, ann)
			}
			if len(p.Message) > 2048+len(p.Key) {
				t.Fatalf("a problem of %d bytes", len(p.Message))
			}
		}
	})
}
