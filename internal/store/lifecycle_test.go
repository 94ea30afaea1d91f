package store

import (
	"errors"
	"io/fs"
	"slices"
	"testing"
)

func TestGoneTellsSubscribersThenRemovesEveryBucket(t *testing.T) {
	s, a := bucket(t, "podmgmt")
	b, err := s.Bucket("warm")
	if err != nil {
		t.Fatal(err)
	}
	for _, bk := range []*Bucket{a, b} {
		if err := bk.Put(sb, []byte("x")); err != nil {
			t.Fatal(err)
		}
		if err := bk.Put("other", []byte("y")); err != nil {
			t.Fatal(err)
		}
	}
	var told []string
	s.Subscribe(func(id string) {
		// Subscribers run before the records go: a feature can still read
		// its own.
		if _, err := a.Get(id); err != nil && len(told) == 0 {
			t.Errorf("record of %s gone before the first subscriber ran: %v", id, err)
		}
		told = append(told, "first "+id)
	})
	s.Subscribe(func(id string) { told = append(told, "second "+id) })
	if err := s.Gone(sb); err != nil {
		t.Fatal(err)
	}
	if want := []string{"first " + sb, "second " + sb}; !slices.Equal(told, want) {
		t.Fatalf("told %v, want %v", told, want)
	}
	for _, bk := range []*Bucket{a, b} {
		if _, err := bk.Get(sb); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("record of the gone sandbox left: %v", err)
		}
		if _, err := bk.Get("other"); err != nil {
			t.Fatalf("record of another sandbox removed: %v", err)
		}
	}
	if err := s.Gone(sb); err != nil {
		t.Fatalf("second Gone: %v", err)
	}
}

func TestGoneOfAHostileIDRemovesNothing(t *testing.T) {
	s, a := bucket(t, "podmgmt")
	if err := a.Put("x", []byte("kept")); err != nil {
		t.Fatal(err)
	}
	told := 0
	s.Subscribe(func(string) { told++ })
	for _, id := range []string{"", "..", "../podmgmt", "podmgmt/x"} {
		if err := s.Gone(id); err != nil {
			t.Fatalf("Gone(%q): %v", id, err)
		}
	}
	if told != 4 {
		t.Fatalf("subscribers told %d times, want 4", told)
	}
	if got, err := a.Get("x"); err != nil || string(got) != "kept" {
		t.Fatalf("record %q, %v", got, err)
	}
}
