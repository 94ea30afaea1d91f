package procstat

import (
	"os"
	"testing"
	"time"
)

func TestOwnProcess(t *testing.T) {
	pid := os.Getpid()
	before := CPUSeconds(pid)
	for end := time.Now().Add(150 * time.Millisecond); time.Now().Before(end); {
	}
	if after := CPUSeconds(pid); after <= before {
		t.Fatalf("CPU did not advance: %v -> %v", before, after)
	}
	if rss := StatusKB(pid, "VmRSS"); rss <= 0 {
		t.Fatalf("VmRSS %d", rss)
	}
	if StatusKB(pid, "NoSuchField") != -1 || CPUSeconds(-1) != 0 {
		t.Fatal("missing data must read as -1 / 0")
	}
}
