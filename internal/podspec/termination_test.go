package podspec

import (
	"strings"
	"testing"
)

func TestParseTermination(t *testing.T) {
	long := strings.Repeat("x", 10000)
	for _, tc := range []struct {
		name    string
		ann     map[string]string
		want    Termination
		problem string
	}{
		{"absent", map[string]string{"other": "immediate"}, TerminationGraceful, ""},
		{"graceful", map[string]string{TerminationKey: "graceful"}, TerminationGraceful, ""},
		{"immediate", map[string]string{TerminationKey: "immediate"}, TerminationImmediate, ""},
		{"empty", map[string]string{TerminationKey: ""}, TerminationGraceful, `restart.cri-shim.io/termination: unknown value ""`},
		{"case differs", map[string]string{TerminationKey: "Immediate"}, TerminationGraceful, `unknown value "Immediate" (want "graceful" or "immediate"; graceful termination applies)`},
		{"padded", map[string]string{TerminationKey: " immediate"}, TerminationGraceful, `unknown value " immediate"`},
		{"long", map[string]string{TerminationKey: long}, TerminationGraceful, "(truncated, 10000 bytes)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, problem := ParseTermination(tc.ann)
			if got != tc.want {
				t.Errorf("termination %q, want %q", got, tc.want)
			}
			if tc.problem == "" && problem != "" {
				t.Errorf("unexpected problem %q", problem)
			}
			if tc.problem != "" && !strings.Contains(problem, tc.problem) {
				t.Errorf("problem %q does not contain %q", problem, tc.problem)
			}
			if len(problem) > 300 {
				t.Errorf("problem of %d bytes repeats the pod's value: %.80s...", len(problem), problem)
			}
		})
	}
}
