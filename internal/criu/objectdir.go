package criu

// ObjectDirPrefix begins the name of every checkpoint directory a PodCheckpoint
// object holds (podcheckpoint.DataDir). Such a directory is restored only
// through its object, never by a restore-from name given directly.
const ObjectDirPrefix = "pcp-"
