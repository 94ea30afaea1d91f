package config

// Marshal: the configuration as commented TOML with every key
// (`cri-shim config default`).

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/pelletier/go-toml/v2"
)

// Marshal renders cfg as commented TOML (`cri-shim config default`), every
// key included. go-toml leaves out an optional key that is unset (a nil
// pointer, an empty list: TOML has no null), so each of those is written
// commented out, with its comment and the value of its example tag, after
// the key before it in its section.
func Marshal(cfg Config) ([]byte, error) {
	b, err := toml.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	lines, err := addExamples(strings.Split(string(b), "\n"), reflect.ValueOf(cfg), "")
	if err != nil {
		return nil, err
	}
	return []byte(strings.Join(lines, "\n")), nil
}

// omitEmpty reports whether go-toml leaves field f out when it is empty.
func omitEmpty(f reflect.StructField) bool {
	_, opts, _ := strings.Cut(f.Tag.Get("toml"), ",")
	return slices.Contains(strings.Split(opts, ","), "omitempty")
}

// addExamples inserts into lines, go-toml's rendering of v in section, the
// commented example of each of v's keys that go-toml left out.
func addExamples(lines []string, v reflect.Value, section string) ([]string, error) {
	t := v.Type()
	var before []string // keys of section already placed, in order
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		key := tomlKey(f)
		if key == "" {
			continue
		}
		fv := v.Field(i)
		switch {
		case f.Type.Kind() == reflect.Struct && f.Type != durationType:
			var err error
			if lines, err = addExamples(lines, fv, join(section, key)); err != nil {
				return nil, err
			}
			continue
		case fv.IsZero() && omitEmpty(f):
			example, ok := f.Tag.Lookup("example")
			if !ok {
				return nil, fmt.Errorf("%s is left out when unset and has no example tag", join(section, key))
			}
			var block []string
			if c := f.Tag.Get("comment"); c != "" {
				block = append(block, "# "+c)
			}
			block = append(block, "# "+key+" = "+example)
			lines = slices.Insert(lines, insertionPoint(lines, section, before), block...)
		}
		before = append(before, key)
	}
	return lines, nil
}

// insertionPoint is the index of the line after the last of keys (set or
// commented out) found in section, else the section's first line.
func insertionPoint(lines []string, section string, keys []string) int {
	start := 0
	if section != "" {
		start = slices.Index(lines, "["+section+"]") + 1
	}
	end := start
	for end < len(lines) && !strings.HasPrefix(lines[end], "[") {
		end++
	}
	for k := len(keys) - 1; k >= 0; k-- {
		for i := end - 1; i >= start; i-- {
			if l := strings.TrimPrefix(lines[i], "# "); strings.HasPrefix(l, keys[k]+" = ") {
				return i + 1
			}
		}
	}
	return start
}
