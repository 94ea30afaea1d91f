package podspec

import (
	"maps"
	"slices"
	"strings"
)

// Spec is what a pod's *.cri-shim.io annotations ask of the shim.
type Spec struct {
	Rules        Rules         // restart rules by container; nil for none
	Termination  Termination   // how an in-place restart stops containers
	Orchestrator *Orchestrator // the pod management channel; nil for none
	// RestoreFrom names the checkpoint the pod warm-starts from ("" for
	// none; checked when the sandbox is created, not here).
	RestoreFrom string
	// Problems are the annotations the shim ignores, each naming its key.
	Problems []Problem
}

// Feature is the part of the shim a problem's annotation belongs to.
type Feature string

const (
	FeatureRestart       Feature = "restart"        // restart rules, termination
	FeaturePodManagement Feature = "pod-management" // the orchestrator channel
)

// Problem is one annotation the shim does not use, and why.
type Problem struct {
	Feature Feature
	// Key is the annotation, or a prefix followed by "*" for a problem of
	// several together (two orchestrators).
	Key     string
	Message string
}

// Parse reads a pod's annotations once, in key order. The checkpoint
// annotations other than restore-from are read where they are used
// (ParseWarmRestart at a restart, ParseSchedule by the scheduler): their
// problems concern a later action and are reported with it.
func Parse(ann map[string]string) Spec {
	var s Spec
	s.Termination = TerminationGraceful
	var channel []string // the single-key problems of pod management
	for _, k := range slices.Sorted(maps.Keys(ann)) {
		switch {
		case strings.HasPrefix(k, RestartRulesPrefix):
			rules, problems := ParseRules(map[string]string{k: ann[k]})
			for c, rs := range rules {
				if s.Rules == nil {
					s.Rules = Rules{}
				}
				s.Rules[c] = rs
			}
			for _, p := range problems {
				s.Problems = append(s.Problems, Problem{FeatureRestart, k, p})
			}
		case k == TerminationKey:
			t, p := ParseTermination(ann)
			s.Termination = t
			if p != "" {
				s.Problems = append(s.Problems, Problem{FeatureRestart, k, p})
			}
		case strings.HasPrefix(k, PodManagementPrefix):
			_, problems := ParseOrchestrator(map[string]string{k: ann[k]})
			for _, p := range problems {
				channel = append(channel, p)
				s.Problems = append(s.Problems, Problem{FeaturePodManagement, k, p})
			}
		case k == RestoreFromKey:
			s.RestoreFrom = ann[k]
		}
	}
	// What is wrong only of several declarations together.
	o, problems := ParseOrchestrator(ann)
	s.Orchestrator = o
	for _, p := range problems {
		if !slices.Contains(channel, p) {
			s.Problems = append(s.Problems, Problem{FeaturePodManagement, PodManagementPrefix + "*", p})
		}
	}
	return s
}

// Annotated reports whether a pod has restart rules or a pod management
// declaration, valid or not: the annotations the admission policy gives
// the shim's readiness gate for.
func Annotated(ann map[string]string) bool {
	for k := range ann {
		if strings.HasPrefix(k, RestartRulesPrefix) || strings.HasPrefix(k, PodManagementPrefix) {
			return true
		}
	}
	return false
}
