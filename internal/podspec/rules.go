package podspec

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// ActionRestartAllContainers is upstream's KEP-5532 action.
const ActionRestartAllContainers = corev1.ContainerRestartRuleAction("RestartAllContainers")

// Rules are the parsed restart rules of a pod, by container name.
type Rules map[string][]corev1.ContainerRestartRule

// ParseRules reads every restart-rules annotation of a pod. A malformed
// annotation never fails the pod: its container simply has no rules, and the
// problem is returned so it can be logged, counted and shown.
func ParseRules(annotations map[string]string) (Rules, []string) {
	var rules Rules
	var problems []string
	for _, k := range keysWith(annotations, RestartRulesPrefix) {
		name := strings.TrimPrefix(k, RestartRulesPrefix)
		rs, err := parseContainerRules(annotations[k])
		if err == nil && name == "" {
			err = fmt.Errorf("no container name after the prefix")
		}
		if err != nil {
			problems = append(problems, fmt.Sprintf("annotation %s: %v (rules ignored; the kubelet's own behaviour applies)", k, err))
			continue
		}
		if rules == nil {
			rules = Rules{}
		}
		rules[name] = rs
	}
	return rules, problems
}

func parseContainerRules(v string) ([]corev1.ContainerRestartRule, error) {
	dec := json.NewDecoder(strings.NewReader(v))
	dec.DisallowUnknownFields()
	var rs []corev1.ContainerRestartRule
	if err := dec.Decode(&rs); err != nil {
		return nil, fmt.Errorf("not a JSON list of ContainerRestartRule: %w", err)
	}
	if dec.More() {
		return nil, fmt.Errorf("trailing data after the JSON list")
	}
	if len(rs) == 0 {
		return nil, fmt.Errorf("empty rule list")
	}
	for i, r := range rs {
		switch r.Action {
		case ActionRestartAllContainers, corev1.ContainerRestartRuleActionRestart:
		default:
			return nil, fmt.Errorf("rule %d: unknown action %q (want %q or %q)", i, r.Action, ActionRestartAllContainers, corev1.ContainerRestartRuleActionRestart)
		}
		if r.ExitCodes == nil {
			return nil, fmt.Errorf("rule %d: exitCodes is required", i)
		}
		switch r.ExitCodes.Operator {
		case corev1.ContainerRestartRuleOnExitCodesOpIn, corev1.ContainerRestartRuleOnExitCodesOpNotIn:
		default:
			return nil, fmt.Errorf("rule %d: exitCodes.operator %q: want In or NotIn", i, r.ExitCodes.Operator)
		}
		if len(r.ExitCodes.Values) == 0 || len(r.ExitCodes.Values) > 255 {
			return nil, fmt.Errorf("rule %d: exitCodes.values: want 1 to 255 exit codes", i)
		}
		for _, c := range r.ExitCodes.Values {
			if c < 0 || c > 255 {
				return nil, fmt.Errorf("rule %d: exit code %d out of range 0..255", i, c)
			}
		}
	}
	return rs, nil
}

// Match returns the action of the first rule of container that matches
// exitCode, or "" when none does (upstream evaluates rules in order).
func (r Rules) Match(container string, exitCode int32) corev1.ContainerRestartRuleAction {
	for _, rule := range r[container] {
		in := slices.Contains(rule.ExitCodes.Values, exitCode)
		if (rule.ExitCodes.Operator == corev1.ContainerRestartRuleOnExitCodesOpIn) == in {
			return rule.Action
		}
	}
	return ""
}
