package config

import (
	"bufio"
	"bytes"
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"
)

// valueKeys are the keys of a decoded TOML value, as structKeys spells them.
func valueKeys(v any, prefix string, into map[string]bool) {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if _, table := e.(map[string]any); !table {
				into[prefix+k] = true
			}
			valueKeys(e, prefix+k+".", into)
		}
	case []any:
		for _, e := range v {
			valueKeys(e, strings.TrimSuffix(prefix, ".")+"[].", into)
		}
	}
}

var commentedKey = regexp.MustCompile(`^#\s*([a-z_]+\s*=.*)$`)

// documentedKeys are the keys a config file sets or shows commented out
// ("# key = value" lines that parse as TOML), with their section.
func documentedKeys(t *testing.T, b []byte) []string {
	t.Helper()
	keys := map[string]bool{}
	var doc map[string]any
	if err := toml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	valueKeys(doc, "", keys)
	section := ""
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "[") {
			section = strings.Trim(line, "[] ") + "."
			continue
		}
		m := commentedKey.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		var kv map[string]any
		if toml.Unmarshal([]byte(m[1]), &kv) != nil {
			continue // prose, not a key
		}
		valueKeys(kv, section, keys)
	}
	out := make([]string, 0, len(keys))
	for k := range keys {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func TestStructKeysSeeEveryField(t *testing.T) {
	keys := Keys()
	for _, want := range []string{"state_dir", "server.listen", "backoff.max_container_restart_period",
		"checkpoint.restore_namespace_allow", "checkpoint.restore_namespace_allow[].from", "checkpoint.registries[].ca_file", "kubernetes.pod_checkpoints"} {
		if !slices.Contains(keys, want) {
			t.Errorf("structKeys lacks %s: %v", want, keys)
		}
	}
}

// `config default` shows every key of the struct, set or commented out, and
// so does deploy/config.toml: a key added to Config without either fails.
func TestDefaultAndShippedExampleShowEveryKey(t *testing.T) {
	want := Keys()
	sort.Strings(want)
	def, err := Marshal(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	shipped, err := os.ReadFile("../../deploy/config.toml")
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"config default": def, "deploy/config.toml": shipped} {
		got := documentedKeys(t, b)
		for _, k := range want {
			if !slices.Contains(got, k) {
				t.Errorf("%s does not show %s", name, k)
			}
		}
		for _, k := range got {
			if !slices.Contains(want, k) {
				t.Errorf("%s shows %s, which Config does not take", name, k)
			}
		}
	}
}

// The commented-out examples of `config default` are valid settings: with
// them uncommented the file decodes and validates, and every key left out
// by default is set.
func TestDefaultExamplesAreValid(t *testing.T) {
	def, err := Marshal(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	var uncommented []string
	examples := 0
	for _, line := range strings.Split(string(def), "\n") {
		if m := commentedKey.FindStringSubmatch(line); m != nil {
			line = m[1]
			examples++
		}
		uncommented = append(uncommented, line)
	}
	if examples != 3 {
		t.Errorf("%d commented-out keys, want 3 (max_container_restart_period, restore_namespace_allow, registries)", examples)
	}
	c := DefaultConfig()
	if err := Decode([]byte(strings.Join(uncommented, "\n")), &c); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.Backoff.MaxContainerRestartPeriod == nil || len(c.Checkpoint.RestoreNamespaceAllow) == 0 ||
		len(c.Checkpoint.Registries) < 2 || c.Checkpoint.Registries[0].CAFile == "" || !c.Checkpoint.Registries[1].PlainHTTP {
		t.Fatalf("examples did not set every optional key: %+v %+v", c.Backoff, c.Checkpoint)
	}
}

// An optional key without an example would silently vanish from `config
// default`; Marshal refuses instead.
func TestMarshalRefusesOptionalKeyWithoutExample(t *testing.T) {
	type section struct {
		Set   int  `toml:"set"`
		Unset *int `toml:"unset,omitempty"`
	}
	type doc struct {
		S section `toml:"s"`
	}
	b, _ := toml.Marshal(doc{})
	_, err := addExamples(strings.Split(string(b), "\n"), reflect.ValueOf(doc{}), "")
	if err == nil || !strings.Contains(err.Error(), "s.unset is left out when unset and has no example tag") {
		t.Fatalf("got %v", err)
	}
}
