package podspec

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Orchestrator is the KEP-5309 podManagement stanza a pod declares.
type Orchestrator struct {
	Container string `json:"container"`
	Port      int    `json:"port"`
	Version   string `json:"version"`
}

// SupportedVersions are the protocol versions the shim speaks.
var SupportedVersions = []string{"1.0"}

// ParseOrchestrator finds the pod's declaration. A malformed one is returned
// as a problem (the pod runs normally, without a channel); more than one
// declaration is a problem too.
func ParseOrchestrator(ann map[string]string) (*Orchestrator, []string) {
	var found []*Orchestrator
	var problems []string
	for _, k := range keysWith(ann, PodManagementPrefix) {
		d, err := parseOne(strings.TrimPrefix(k, PodManagementPrefix), ann[k])
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", k, err))
			continue
		}
		found = append(found, d)
	}
	if len(found) > 1 {
		problems = append(problems, fmt.Sprintf("%d containers declare pod management; only one may", len(found)))
		return nil, problems
	}
	if len(found) == 0 {
		return nil, problems
	}
	return found[0], problems
}

func parseOne(container, v string) (*Orchestrator, error) {
	if container == "" || len(container) > 63 || strings.ContainsAny(container, "/ ") {
		return nil, fmt.Errorf("%q is not a container name", container)
	}
	dec := json.NewDecoder(strings.NewReader(v))
	dec.DisallowUnknownFields()
	// The stanza's own fields only: the container is the annotation's key.
	var d struct {
		Port    int    `json:"port"`
		Version string `json:"version"`
	}
	if err := dec.Decode(&d); err != nil {
		return nil, fmt.Errorf(`want {"port": 50051, "version": "1.0"}: %v`, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("trailing data after the JSON object")
	}
	if d.Port < 1 || d.Port > 65535 {
		return nil, fmt.Errorf("port %d is not 1..65535", d.Port)
	}
	ok := false
	for _, s := range SupportedVersions {
		ok = ok || s == d.Version
	}
	if !ok {
		return nil, fmt.Errorf("version %q is not one cri-shim speaks (%s)", d.Version, strings.Join(SupportedVersions, ", "))
	}
	return &Orchestrator{Container: container, Port: d.Port, Version: d.Version}, nil
}
