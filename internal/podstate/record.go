package podstate

import "github.com/cri-shim/cri-shim/internal/restartrecord"

// The restart record (internal/restartrecord) by the names this package
// works with.
type (
	Pod      = restartrecord.Pod
	Instance = restartrecord.Instance
	Phase    = restartrecord.Phase
	SeqEntry = restartrecord.SeqEntry
)

const (
	PhaseRunning     = restartrecord.PhaseRunning
	PhaseTerminating = restartrecord.PhaseTerminating
	PhaseStartup     = restartrecord.PhaseStartup
	PartNone         = restartrecord.PartNone
	PartOld          = restartrecord.PartOld
	PartNew          = restartrecord.PartNew
)
