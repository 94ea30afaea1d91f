package podspec

import (
	"strings"
	"testing"
)

func TestParseRules(t *testing.T) {
	good := `[{"action":"RestartAllContainers","exitCodes":{"operator":"In","values":[88]}}]`
	for _, tc := range []struct {
		name    string
		ann     map[string]string
		want    map[string]bool // containers with rules
		problem string
	}{
		{"none", map[string]string{"other": "x"}, nil, ""},
		{"one", map[string]string{RestartRulesPrefix + "main": good}, map[string]bool{"main": true}, ""},
		{"malformed json", map[string]string{RestartRulesPrefix + "main": `[{`}, nil, "not a JSON list"},
		{"unknown action", map[string]string{RestartRulesPrefix + "main": `[{"action":"Explode","exitCodes":{"operator":"In","values":[1]}}]`}, nil, `unknown action "Explode"`},
		{"restart", map[string]string{RestartRulesPrefix + "main": `[{"action":"Restart","exitCodes":{"operator":"NotIn","values":[0]}}]`}, map[string]bool{"main": true}, ""},
		{"bad operator", map[string]string{RestartRulesPrefix + "main": `[{"action":"RestartAllContainers","exitCodes":{"operator":"Gt","values":[1]}}]`}, nil, "operator"},
		{"no exit codes", map[string]string{RestartRulesPrefix + "main": `[{"action":"RestartAllContainers"}]`}, nil, "exitCodes is required"},
		{"code out of range", map[string]string{RestartRulesPrefix + "main": `[{"action":"RestartAllContainers","exitCodes":{"operator":"In","values":[256]}}]`}, nil, "out of range"},
		{"unknown field", map[string]string{RestartRulesPrefix + "main": `[{"action":"RestartAllContainers","exitCode":{"operator":"In","values":[1]}}]`}, nil, "unknown field"},
		{"empty name", map[string]string{RestartRulesPrefix: good}, nil, "no container name"},
		{"one good one bad", map[string]string{RestartRulesPrefix + "main": good, RestartRulesPrefix + "side": "nope"}, map[string]bool{"main": true}, "restart-rules.cri-shim.io/side"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rules, problems := ParseRules(tc.ann)
			if len(rules) != len(tc.want) {
				t.Fatalf("rules for %d containers, want %d: %v", len(rules), len(tc.want), rules)
			}
			for c := range tc.want {
				if len(rules[c]) == 0 {
					t.Fatalf("no rules for %s", c)
				}
			}
			if tc.problem == "" && len(problems) > 0 {
				t.Fatalf("unexpected problems %v", problems)
			}
			if tc.problem != "" && (len(problems) == 0 || !strings.Contains(strings.Join(problems, "\n"), tc.problem)) {
				t.Fatalf("problems %v do not mention %q", problems, tc.problem)
			}
		})
	}
}

func TestMatch(t *testing.T) {
	rules, _ := ParseRules(map[string]string{
		RestartRulesPrefix + "main": `[{"action":"RestartAllContainers","exitCodes":{"operator":"In","values":[88,89]}}]`,
		RestartRulesPrefix + "side": `[{"action":"RestartAllContainers","exitCodes":{"operator":"NotIn","values":[0]}}]`,
	})
	for _, tc := range []struct {
		c    string
		code int32
		want bool
	}{
		{"main", 88, true}, {"main", 89, true}, {"main", 1, false}, {"main", 0, false},
		{"side", 0, false}, {"side", 1, true}, {"side", 137, true},
		{"other", 88, false},
	} {
		if got := rules.Match(tc.c, tc.code) == ActionRestartAllContainers; got != tc.want {
			t.Errorf("%s exit %d: match %v, want %v", tc.c, tc.code, got, tc.want)
		}
	}
}

// FuzzParseRules feeds hostile values to the pod annotations podstate reads:
// a container's restart rules and the pod's termination choice.
func FuzzParseRules(f *testing.F) {
	f.Add(`[{"action":"RestartAllContainers","exitCodes":{"operator":"In","values":[88]}}]`, "immediate")
	f.Add(`[]`, "graceful")
	f.Add(`[{"action":"RestartAllContainers","exitCodes":{"operator":"NotIn","values":[-1]}}]`, "")
	f.Add(`null`, "Immediate\x00")
	f.Fuzz(func(t *testing.T, v, term string) {
		rules, problems := ParseRules(map[string]string{RestartRulesPrefix + "c": v})
		if (len(rules) == 0) == (len(problems) == 0) {
			t.Fatalf("exactly one of rules/problems must be set: %v %v", rules, problems)
		}
		for i := int32(-1); i < 257; i += 64 {
			_ = rules.Match("c", i)
		}
		got, problem := ParseTermination(map[string]string{TerminationKey: term})
		switch {
		case term == string(TerminationGraceful) || term == string(TerminationImmediate):
			if got != Termination(term) || problem != "" {
				t.Fatalf("%q: termination %q problem %q", term, got, problem)
			}
		case got != TerminationGraceful || !strings.HasPrefix(problem, "annotation "+TerminationKey+": unknown value "):
			t.Fatalf("%q: termination %q problem %q, want graceful and the annotation named", term, got, problem)
		case len(problem) > 200+10*maxQuoted: // a rune quotes to 10 bytes at most (\U0010ffff)
			t.Fatalf("%q: a problem of %d bytes", term, len(problem))
		}
	})
}
