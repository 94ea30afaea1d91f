package config

// The shape check: before a file is decoded into Config, its TOML values are
// compared with the struct, so that every unknown key and every value of the
// wrong type is reported at its full path, list entries by index
// (checkpoint.registries[0].ca_file). go-toml's own errors name the list, not
// the entry, and a number given for a duration reaches Duration.UnmarshalText
// as text with no field named at all (go-toml v2 unmarshaler.go,
// tryTextUnmarshaler).

import (
	"fmt"
	"reflect"
	"sort"
	"strings"
	"time"
)

var durationType = reflect.TypeOf(Duration{})

// tomlKey is the key that sets struct field f in the file: its toml tag's
// name, else its Go name; "" for a field the file cannot set.
func tomlKey(f reflect.StructField) string {
	if !f.IsExported() {
		return ""
	}
	tag, ok := f.Tag.Lookup("toml")
	if tag == "-" {
		return ""
	}
	if name, _, _ := strings.Cut(tag, ","); ok && name != "" {
		return name
	}
	return f.Name
}

// fieldFor finds the field of struct type t that key sets, as go-toml does:
// the exact key, else the key case-folded (go-toml v2 unmarshaler.go,
// structPlan.lookup).
func fieldFor(t reflect.Type, key string) (reflect.StructField, bool) {
	var folded reflect.StructField
	found := false
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		switch name := tomlKey(f); {
		case name == "":
		case name == key:
			return f, true
		case !found && strings.EqualFold(name, key):
			folded, found = f, true
		}
	}
	return folded, found
}

// shapeErrors lists what of doc (a TOML document decoded into generic
// values) does not fit struct type t: unknown keys, then values of the wrong
// type, each at its path.
func shapeErrors(doc map[string]any, t reflect.Type) (unknown, wrong []string) {
	s := &shape{}
	s.table(doc, t, "")
	return s.unknown, s.wrong
}

type shape struct{ unknown, wrong []string }

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func (s *shape) table(m map[string]any, t reflect.Type, path string) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		f, ok := fieldFor(t, k)
		if !ok {
			s.unknown = append(s.unknown, join(path, k))
			continue
		}
		s.value(m[k], f.Type, join(path, k))
	}
}

func (s *shape) value(v any, t reflect.Type, path string) {
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	want := ""
	switch {
	case t == durationType:
		str, ok := v.(string)
		if !ok {
			want = `a duration string like "10s"`
			break
		}
		if _, err := time.ParseDuration(str); err != nil {
			s.wrong = append(s.wrong, fmt.Sprintf("%s: want a duration like \"10s\" (units ns, us, ms, s, m, h), got %q", path, str))
		}
	case t.Kind() == reflect.Struct:
		m, ok := v.(map[string]any)
		if !ok {
			want = "a table"
			break
		}
		s.table(m, t, path)
	case t.Kind() == reflect.Slice:
		l, ok := v.([]any)
		if !ok {
			want = "a list"
			break
		}
		for i, e := range l {
			s.value(e, t.Elem(), fmt.Sprintf("%s[%d]", path, i))
		}
	case t.Kind() == reflect.String:
		if _, ok := v.(string); !ok {
			want = "a string"
		}
	case t.Kind() == reflect.Bool:
		if _, ok := v.(bool); !ok {
			want = "true or false"
		}
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64:
		if _, ok := v.(int64); !ok {
			want = "a whole number"
		}
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		switch v.(type) {
		case int64, float64:
		default:
			want = "a number"
		}
	}
	if want != "" {
		s.wrong = append(s.wrong, fmt.Sprintf("%s: want %s, got %s", path, want, describe(v)))
	}
}

// describe names a decoded TOML value in an error.
func describe(v any) string {
	switch v := v.(type) {
	case string:
		return fmt.Sprintf("the string %q", v)
	case int64:
		return fmt.Sprintf("the number %d", v)
	case float64:
		return fmt.Sprintf("the number %v", v)
	case bool:
		return fmt.Sprintf("%v", v)
	case map[string]any:
		return "a table"
	case []any:
		return "a list"
	}
	return fmt.Sprintf("a date or time (%v)", v)
}
