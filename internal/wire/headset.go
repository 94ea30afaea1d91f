package wire

import "slices"

// HeadSet is a set of container IDs' heads (IDHead), asked of every entry
// of a large node's list by the relist's walk. It is built once and only
// read after, so the walk reads it without a lock. Most entries are not in
// it: a 64 Kibit filter (8 KiB, which stays in L1) answers those with one
// load, and a hit is confirmed in the sorted heads.
type HeadSet struct {
	filter [1 << headBits / 64]uint64
	heads  []uint64 // sorted, without repeats
}

const headBits = 16

// NewHeadSet is the set of heads (taken over, sorted in place).
func NewHeadSet(heads []uint64) *HeadSet {
	slices.Sort(heads)
	s := &HeadSet{heads: slices.Compact(heads)}
	for _, h := range s.heads {
		k := headSlot(h)
		s.filter[k/64] |= 1 << (k % 64)
	}
	return s
}

// Has reports whether h is in s; a nil set holds nothing.
func (s *HeadSet) Has(h uint64) bool {
	if s == nil {
		return false
	}
	k := headSlot(h)
	if s.filter[k/64]&(1<<(k%64)) == 0 {
		return false
	}
	_, ok := slices.BinarySearch(s.heads, h)
	return ok
}

// Len is the number of heads in s.
func (s *HeadSet) Len() int {
	if s == nil {
		return 0
	}
	return len(s.heads)
}

// headSlot spreads a head over the filter's bits: a head is eight hex
// digits, 32 bits of entropy in 64, which a multiplication by the golden
// ratio mixes into the top bits.
func headSlot(h uint64) uint64 { return (h * 0x9e3779b97f4a7c15) >> (64 - headBits) }
