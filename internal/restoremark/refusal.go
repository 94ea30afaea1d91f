package restoremark

// A refusal goes back the other way: when the runtime shim's own check of a
// claimed mark's images refuses them (at task create, against the bundle's
// spec and the container's finished rootfs), it leaves the reason beside the
// claimed mark, so that cri-shim learns that the checkpoint, not the node,
// failed the start: it records the warm start as refused and frees a pulled
// checkpoint at once rather than reading it again at every kubelet retry.

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// refusedSuffix names the refusal of a claimed mark.
const refusedSuffix = ".refused"

// Refusal is why the runtime shim refused a checkpoint: criucheck.Refusal's
// fields.
type Refusal struct {
	Image  string `json:"image"`
	Field  string `json:"field,omitempty"`
	Reason string `json:"reason"`
}

func (d Dir) refused(id string) string { return filepath.Join(d.Path, id+refusedSuffix) }

// Refuse records r as the reason container id's claimed mark was refused.
// Fields longer than a mark may be are cut; the file is written under a
// temporary name with its final mode and renamed into place.
func (d Dir) Refuse(id string, r Refusal) error {
	if err := checkID(id); err != nil {
		return err
	}
	if err := d.checkDir(); err != nil {
		return err
	}
	for _, f := range []*string{&r.Image, &r.Field, &r.Reason} {
		if len(*f) > maxMarkSize/4 {
			*f = (*f)[:maxMarkSize/4]
		}
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	tmp := filepath.Join(d.Path, "."+id+refusedSuffix+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("restore refusal: %w", err)
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, d.refused(id))
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("restore refusal of %s: %w", id, err)
	}
	return nil
}

// Refused is the refusal the runtime shim recorded for container id: nil
// when there is none, or when what is there is not owner's or cannot be
// read (the start's error still says why).
func (d Dir) Refused(id string) *Refusal {
	if checkID(id) != nil {
		return nil
	}
	f, err := os.OpenFile(d.refused(id), os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil
	}
	defer f.Close()
	if checkOwned(f, d.Owner, false) != nil {
		return nil
	}
	b, err := io.ReadAll(io.LimitReader(f, maxMarkSize+1))
	if err != nil || len(b) > maxMarkSize {
		return nil
	}
	var r Refusal
	if json.Unmarshal(b, &r) != nil || r.Reason == "" {
		return nil
	}
	return &r
}
