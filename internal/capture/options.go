package capture

import (
	"fmt"
	"sort"
	"strconv"
)

// Options of CheckpointPod this runtime understands. The CRI contract says
// unknown keys and invalid values are rejected, never ignored.
const (
	// OptionSequential, "true", captures the containers one after another
	// instead of in parallel (the pod stays paused longer; for comparison and
	// for nodes short of memory for parallel CRIU runs).
	OptionSequential = "cri-shim.io/sequential"
	// OptionManaged, "true", marks the output directory as made by
	// 'cri-shim checkpoint': retention may remove it later.
	OptionManaged = "cri-shim.io/managed"
)

type checkpointOptions struct {
	sequential bool
	managed    bool
}

func parseCheckpointOptions(m map[string]string) (checkpointOptions, error) {
	var o checkpointOptions
	for _, k := range sortedKeys(m) {
		v := m[k]
		var dst *bool
		switch k {
		case OptionSequential:
			dst = &o.sequential
		case OptionManaged:
			dst = &o.managed
		default:
			return o, fmt.Errorf("unknown checkpoint option %q (this runtime knows %s and %s)", k, OptionSequential, OptionManaged)
		}
		b, err := strconv.ParseBool(v)
		if err != nil {
			return o, fmt.Errorf("checkpoint option %s=%q: want true or false", k, v)
		}
		*dst = b
	}
	return o, nil
}

func sortedKeys(m map[string]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
