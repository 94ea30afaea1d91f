package wire

import (
	"crypto/rand"
	"encoding/hex"
	"testing"
)

// A HeadSet holds exactly the heads it was made of, whatever the filter
// lets through; the filter turns away most others on its own.
func TestHeadSet(t *testing.T) {
	randomHead := func() uint64 {
		var b [32]byte
		rand.Read(b[:])
		return IDHead([]byte(hex.EncodeToString(b[:])))
	}
	in := map[uint64]bool{}
	var heads []uint64
	for range 600 {
		h := randomHead()
		in[h] = true
		heads = append(heads, h, h) // repeats are kept once
	}
	s := NewHeadSet(heads)
	if s.Len() != len(in) {
		t.Fatalf("Len %d, want %d", s.Len(), len(in))
	}
	for h := range in {
		if !s.Has(h) {
			t.Fatalf("%x is not held", h)
		}
	}
	passed := 0
	for range 100000 {
		h := randomHead()
		if in[h] {
			continue
		}
		if s.Has(h) {
			t.Fatalf("%x is held", h)
		}
		k := headSlot(h)
		if s.filter[k/64]&(1<<(k%64)) != 0 {
			passed++
		}
	}
	// 600 of 65,536 bits set: about 0.9 % of other heads pass the filter.
	if passed > 2000 {
		t.Fatalf("the filter let %d of 100000 other heads through", passed)
	}
	var none *HeadSet
	if none.Has(heads[0]) || none.Len() != 0 || NewHeadSet(nil).Has(0) {
		t.Fatal("an empty set holds something")
	}
}
