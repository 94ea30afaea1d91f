// Package podmgmt is cri-shim's side of the pod self-orchestration channel
// (KEP-5309, api/podmanagement/v1): a pod declares, by annotation, a container
// that serves PodManagement; the shim connects to it once it runs, notifies it
// of every container's starts and exits, and carries out its commands.
package podmgmt

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
)

// AnnotationPrefix + container name declares the orchestrator container.
const AnnotationPrefix = "pod-management.cri-shim.io/"

// Declaration is the KEP's podManagement stanza.
type Declaration struct {
	Container string `json:"container"`
	Port      int    `json:"port"`
	Version   string `json:"version"`
}

// SupportedVersions are the protocol versions the shim speaks.
var SupportedVersions = []string{"1.0"}

// ParseAnnotations finds the pod's declaration. A malformed one is returned
// as a problem (the pod runs normally, without a channel); more than one
// declaration is a problem too.
func ParseAnnotations(ann map[string]string) (*Declaration, []string) {
	var found []*Declaration
	var problems []string
	keys := make([]string, 0, len(ann))
	for k := range ann {
		if strings.HasPrefix(k, AnnotationPrefix) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		d, err := parseOne(strings.TrimPrefix(k, AnnotationPrefix), ann[k])
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

func parseOne(container, v string) (*Declaration, error) {
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
	return &Declaration{Container: container, Port: d.Port, Version: d.Version}, nil
}
