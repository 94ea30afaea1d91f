package config

import (
	"encoding"
	"reflect"
	"strings"
)

// Keys lists every key the configuration file takes, from Config's toml
// tags: a table's keys as "table.key", a list of tables as its own key and
// its entries' keys as "list[].key". A type that parses itself from text
// (Duration) is a key, not a table.
func Keys() []string { return keysOf(reflect.TypeFor[Config](), "") }

func keysOf(t reflect.Type, prefix string) []string {
	text := reflect.TypeFor[encoding.TextUnmarshaler]()
	var keys []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
		if name == "" || name == "-" {
			continue
		}
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		switch {
		case ft.Kind() == reflect.Struct && !reflect.PointerTo(ft).Implements(text):
			keys = append(keys, keysOf(ft, prefix+name+".")...)
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			keys = append(keys, prefix+name)
			keys = append(keys, keysOf(ft.Elem(), prefix+name+"[].")...)
		default:
			keys = append(keys, prefix+name)
		}
	}
	return keys
}
