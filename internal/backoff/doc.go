// Package backoff holds the restart backoff curve (KEP-4603) applied to the restarts the shim governs. Not implemented yet: see the tuned backoff issue.
package backoff
