package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestDefaultConfigIsValid(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

// deploy/config.toml is the documented example: it must parse and equal the defaults.
func TestShippedExampleMatchesDefaults(t *testing.T) {
	b, err := os.ReadFile("../../deploy/config.toml")
	if err != nil {
		t.Fatal(err)
	}
	var c Config
	if err := Decode(b, &c); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c, DefaultConfig()) {
		t.Fatalf("deploy/config.toml differs from DefaultConfig():\n%+v\n%+v", c, DefaultConfig())
	}
}

func TestDecodeAndValidate(t *testing.T) {
	for _, tc := range []struct {
		name, toml, wantErr string
	}{
		{"empty file keeps defaults", "", ""},
		{"override listen", "[server]\nlisten = \"unix:///run/x/shim.sock\"\n", ""},
		{"unknown top-level key", "stat_dir = \"/x\"\n", "unknown field stat_dir"},
		{"unknown nested key", "[runtime]\nendpont = \"/x\"\n", "unknown field runtime.endpont"},
		{"wrong type", "[server]\nmax_recv_message_size = \"big\"\n", "server.max_recv_message_size"},
		{"bad duration", "[server]\nshutdown_timeout = \"soon\"\n", "shutdown_timeout"},
		{"syntax error", "[server\n", "line 1"},
		{"relative listen", "[server]\nlisten = \"shim.sock\"\n", "server.listen: must be an absolute"},
		{"relative endpoint", "[runtime]\nendpoint = \"containerd.sock\"\n", "runtime.endpoint: must be an absolute"},
		{"endpoint is own socket", "[runtime]\nendpoint = \"/run/cri-shim/cri-shim.sock\"\n", "forward to itself"},
		{"bad mode", "[server]\nsocket_mode = \"rw\"\n", "server.socket_mode"},
		{"mode too wide", "[server]\nsocket_mode = \"7777\"\n", "server.socket_mode"},
		{"message size too small", "[server]\nmax_recv_message_size = 1024\n", "server.max_recv_message_size"},
		{"max procs 0 (one per CPU)", "[server]\nmax_procs = 0\n", ""},
		{"max procs negative", "[server]\nmax_procs = -1\n", "server.max_procs: must be 0 (one per CPU) to 1024, got -1"},
		{"max procs too many", "[server]\nmax_procs = 5000\n", "server.max_procs"},
		{"memory limit 32 MiB", "[server]\nmemory_limit = 33554432\n", ""},
		{"memory limit too small", "[server]\nmemory_limit = 1048576\n", "server.memory_limit: must be 0 (no limit) or from 16777216 (16 MiB) to 68719476736 (64 GiB) bytes, got 1048576"},
		{"memory limit negative", "[server]\nmemory_limit = -1\n", "server.memory_limit: must be 0"},
		{"timer slack off", "[server]\ntimer_slack = \"0s\"\n", ""},
		{"timer slack 100ms", "[server]\ntimer_slack = \"100ms\"\n", ""},
		{"timer slack negative", "[server]\ntimer_slack = \"-1ms\"\n", "server.timer_slack: must be between 0s (keep the inherited slack) and 100ms, got -1ms"},
		{"timer slack too long", "[server]\ntimer_slack = \"1s\"\n", "server.timer_slack: must be between 0s (keep the inherited slack) and 100ms, got 1s"},
		{"timer slack not a duration", "[server]\ntimer_slack = \"soon\"\n", "timer_slack"},
		{"reconnect too fast", "[runtime]\nreconnect_max_delay = \"1ms\"\n", "runtime.reconnect_max_delay"},
		{"bad level", "[log]\nlevel = \"loud\"\n", "log.level"},
		{"kubeconfig set", "[kubernetes]\nkubeconfig = \"/etc/kubernetes/kubelet.conf\"\nnode_name = \"node-1.example\"\n", ""},
		{"relative kubeconfig", "[kubernetes]\nkubeconfig = \"kubelet.conf\"\n", "kubernetes.kubeconfig: must be an absolute path"},
		{"bad node name", "[kubernetes]\nnode_name = \"Node_1\"\n", "kubernetes.node_name: must be a node name"},
		{"qps zero", "[kubernetes]\nqps = 0.0\n", "kubernetes.qps"},
		{"burst zero", "[kubernetes]\nburst = 0\n", "kubernetes.burst"},
		{"bad format", "[log]\nformat = \"xml\"\n", "log.format"},
		{"relative state dir", "state_dir = \"state\"\n", "state_dir"},
		{"node max 4", "[backoff]\nmax_container_restart_period = 4\n", ""},
		{"kubelet keeps 3 dead", "[backoff]\nkubelet_dead_containers_per_container = 3\n", ""},
		{"kubelet keeps 0 dead", "[backoff]\nkubelet_dead_containers_per_container = 0\n", "backoff.kubelet_dead_containers_per_container: must be from 1 to 100, got 0"},
		{"kubelet keeps 101 dead", "[backoff]\nkubelet_dead_containers_per_container = 101\n", "got 101"},
		{"node max 0", "[backoff]\nmax_container_restart_period = 0\n", "backoff.max_container_restart_period: must be whole seconds from 1 to 300, got 0"},
		{"node max 301", "[backoff]\nmax_container_restart_period = 301\n", "got 301"},
		{"node max abc", "[backoff]\nmax_container_restart_period = \"abc\"\n", "backoff.max_container_restart_period"},
		{"node max fractional", "[backoff]\nmax_container_restart_period = 2.5\n", "backoff.max_container_restart_period"},
		{"initial zero", "[backoff]\ninitial_delay = \"0s\"\n", "initial delay must be positive"},
		{"max below initial", "[backoff]\ninitial_delay = \"10s\"\nmax_delay = \"5s\"\n", "below the initial delay"},
		{"restore allow pair", "[checkpoint]\nrestore_namespace_allow = [{from = \"staging\", to = \"ci\"}]\n", ""},
		{"restore allow tables", "[[checkpoint.restore_namespace_allow]]\nfrom = \"a\"\nto = \"b\"\n[[checkpoint.restore_namespace_allow]]\nfrom = \"b\"\nto = \"a\"\n", ""},
		{"restore allow empty list", "[checkpoint]\nrestore_namespace_allow = []\n", ""},
		{"registries", "[checkpoint]\nregistries = [{host = \"registry.example.com\", namespaces = [\"*\"]}, {host = \"127.0.0.1:5000\", namespaces = [\"a\", \"b\"], plain_http = true, anonymous_push = true}, {host = \"r.example:5443\", namespaces = [\"a\"], ca_file = \"/etc/ca.pem\"}]\n", ""},
		{"registry plain http not loopback", "[checkpoint]\nregistries = [{host = \"10.0.0.1:5000\", namespaces = [\"*\"], plain_http = true}]\n", "checkpoint.registries[0]: plain_http is allowed only for a loopback registry"},
		{"registry repository prefixes", "[checkpoint]\nregistries = [{host = \"r.example/team-a\", namespaces = [\"a\"]}, {host = \"r.example/team-b/ckpt\", namespaces = [\"b\"]}, {host = \"r.example\", namespaces = [\"ops\"]}]\n", ""},
		{"registry prefix ends in a slash", "[checkpoint]\nregistries = [{host = \"r.example/ns/\", namespaces = [\"*\"]}]\n", "checkpoint.registries[0]: host \"r.example/ns/\": the repository prefix after the registry is empty or ends in /"},
		{"registry prefix not of the spec's form", "[checkpoint]\nregistries = [{host = \"r.example/Team/../x\", namespaces = [\"*\"]}]\n", "repository component \"Team\" is not of the distribution spec's form"},
		{"registry prefix with a digest", "[checkpoint]\nregistries = [{host = \"r.example/ns@sha256:00\", namespaces = [\"*\"]}]\n", "must be a registry host or host:port, optionally followed by /repository/prefix"},
		{"registry without namespaces", "[checkpoint]\nregistries = [{host = \"r.example\"}]\n", "checkpoint.registries[0].namespaces: is empty: list the namespaces whose pods may restore from and export to these repositories, or [\"*\"] for every namespace"},
		{"registry namespace not a name", "[checkpoint]\nregistries = [{host = \"r.example\", namespaces = [\"A_b\"]}]\n", "checkpoint.registries[0].namespaces: \"A_b\" is not a namespace name"},
		{"registry wildcard not alone", "[checkpoint]\nregistries = [{host = \"r.example\", namespaces = [\"*\", \"a\"]}]\n", "checkpoint.registries[0].namespaces: \"*\" stands for every namespace and must be alone"},
		{"registry namespace twice", "[checkpoint]\nregistries = [{host = \"r.example\", namespaces = [\"a\", \"a\"]}]\n", "checkpoint.registries[0].namespaces: \"a\" is listed twice"},
		{"registry entries disagree on the connection", "[checkpoint]\nregistries = [{host = \"r.example/a\", namespaces = [\"a\"]}, {host = \"r.example/b\", namespaces = [\"b\"], ca_file = \"/etc/ca.pem\"}]\n", "checkpoint.registries[1]: host \"r.example/b\": plain_http and ca_file must be the same in every entry of registry r.example"},
		{"registry docker hub alias", "[checkpoint]\nregistries = [{host = \"docker.io\", namespaces = [\"*\"]}]\n", "known to image references as \"index.docker.io\""},
		{"registry twice", "[checkpoint]\nregistries = [{host = \"r.example\", namespaces = [\"*\"]}, {host = \"R.example\", namespaces = [\"*\"]}]\n", "checkpoint.registries[1]: host \"R.example\" is listed twice"},
		{"registry prefix twice", "[checkpoint]\nregistries = [{host = \"r.example/x\", namespaces = [\"a\"]}, {host = \"r.example/x\", namespaces = [\"b\"]}]\n", "checkpoint.registries[1]: host \"r.example/x\" is listed twice"},
		{"registry ca relative", "[checkpoint]\nregistries = [{host = \"r.example\", namespaces = [\"*\"], ca_file = \"ca.pem\"}]\n", "checkpoint.registries[0].ca_file: must be an absolute path"},
		{"concurrent captures zero", "[checkpoint]\nmax_concurrent_captures = 0\n", "checkpoint.max_concurrent_captures: must be from 1 to 64, got 0"},
		{"concurrent captures one", "[checkpoint]\nmax_concurrent_captures = 1\n", ""},
		{"pod min gap off", "[checkpoint]\npod_min_gap = \"0s\"\n", ""},
		{"pod min gap too long", "[checkpoint]\npod_min_gap = \"2h\"\n", "checkpoint.pod_min_gap: must be from 0 (no gap) to 1h, got 2h0m0s"},
		{"pull wait too long", "[checkpoint]\npull_wait = \"5m\"\n", "checkpoint.pull_wait: must be from 0 to 3m"},
		{"object wait off", "[checkpoint]\nobject_wait = \"0s\"\n", ""},
		{"object wait at its bound", "[checkpoint]\nobject_wait = \"15s\"\n", ""},
		{"object wait too long", "[checkpoint]\nobject_wait = \"16s\"\n", "checkpoint.object_wait: must be from 0 to 15s (one read of the object is given 15s), got 16s"},
		{"object wait negative", "[checkpoint]\nobject_wait = \"-1s\"\n", "checkpoint.object_wait: must be from 0 to 15s"},
		{"object wait not a duration", "[checkpoint]\nobject_wait = \"soon\"\n", "checkpoint.object_wait"},
		{"pull max bytes zero", "[checkpoint]\npull_max_bytes = 0\n", "checkpoint.pull_max_bytes: must be above 0"},
		{"pull max total negative", "[checkpoint]\npull_max_total_bytes = -1\n", "checkpoint.pull_max_total_bytes: must be 0 (no bound) or at least"},
		{"pull max total below one pull", "[checkpoint]\npull_max_bytes = 2048\npull_max_total_bytes = 1024\n", "checkpoint.pull_max_total_bytes: must be 0 (no bound) or at least checkpoint.pull_max_bytes (2048)"},
		{"restore allow missing to", "[checkpoint]\nrestore_namespace_allow = [{from = \"a\"}]\n", "checkpoint.restore_namespace_allow[0].to: must be a namespace name"},
		{"restore allow bad from", "[checkpoint]\nrestore_namespace_allow = [{from = \"A/../b\", to = \"b\"}]\n", "checkpoint.restore_namespace_allow[0].from: must be a namespace name"},
		{"restore allow wildcard", "[checkpoint]\nrestore_namespace_allow = [{from = \"*\", to = \"b\"}]\n", "checkpoint.restore_namespace_allow[0].from"},
		{"restore allow same", "[checkpoint]\nrestore_namespace_allow = [{from = \"a\", to = \"a\"}]\n", "checkpoint.restore_namespace_allow[0]: from and to are both \"a\""},
		{"restore allow twice", "[checkpoint]\nrestore_namespace_allow = [{from = \"a\", to = \"b\"}, {from = \"a\", to = \"b\"}]\n", "checkpoint.restore_namespace_allow[1]: {from = \"a\", to = \"b\"} is listed twice"},
		{"restore allow unknown key", "[checkpoint]\nrestore_namespace_allow = [{from = \"a\", to = \"b\", both = true}]\n", "unknown field checkpoint.restore_namespace_allow[0].both"},
		{"registry unknown key, array table", "[[checkpoint.registries]]\nhost = \"a.example\"\nnamespaces = [\"*\"]\n[[checkpoint.registries]]\nhost = \"b.example\"\nbogus = 1\n", "unknown field checkpoint.registries[1].bogus"},
		{"registry unknown key, inline", "[checkpoint]\nregistries = [{host = \"a.example\", bogus = 1}]\n", "unknown field checkpoint.registries[0].bogus"},
		{"registry host a number", "[[checkpoint.registries]]\nhost = 5\n", "checkpoint.registries[0].host: want a string, got the number 5"},
		{"registry not a table", "[checkpoint]\nregistries = [\"r.example\"]\n", "checkpoint.registries[0]: want a table, got the string \"r.example\""},
		{"section not a table", "server = 1\n", "server: want a table, got the number 1"},
		{"duration as integer", "[backoff]\ninitial_delay = 10\n", "backoff.initial_delay: want a duration string like \"10s\", got the number 10"},
		{"duration as float", "[server]\nshutdown_timeout = 1.5\n", "server.shutdown_timeout: want a duration string like \"10s\", got the number 1.5"},
		{"duration as bool", "[checkpoint]\npull_wait = true\n", "checkpoint.pull_wait: want a duration string like \"10s\", got true"},
		{"duration without unit", "[backoff]\nmax_delay = \"10\"\n", "backoff.max_delay: want a duration like \"10s\" (units ns, us, ms, s, m, h), got \"10\""},
		{"bool as string", "[metrics]\nprofiling = \"yes\"\n", "metrics.profiling: want true or false, got the string \"yes\""},
		{"qps as integer", "[kubernetes]\nqps = 7\n", ""},
		{"key in another case, as go-toml matches it", "State_Dir = \"/var/lib/x\"\n", ""},
		{"every problem at once", "bogus = 1\n[server]\nlistn = 1\nmax_procs = \"2\"\n", "unknown field bogus, server.listn\nserver.max_procs: want a whole number, got the string \"2\""},
		{"restore allow not a list", "[checkpoint]\nrestore_namespace_allow = \"a:b\"\n", "checkpoint.restore_namespace_allow"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			err := Decode([]byte(tc.toml), &c)
			if err == nil {
				err = c.Validate()
			}
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.wantErr != "" && err == nil:
				t.Fatalf("accepted; want error containing %q", tc.wantErr)
			case tc.wantErr != "" && !strings.Contains(err.Error(), tc.wantErr):
				t.Fatalf("error %q does not name %q", err, tc.wantErr)
			}
		})
	}
}

func TestValidateReportsEveryBadField(t *testing.T) {
	c := DefaultConfig()
	c.Log.Level = "x"
	c.Log.Format = "y"
	err := c.Validate()
	if err == nil || !strings.Contains(err.Error(), "log.level") || !strings.Contains(err.Error(), "log.format") {
		t.Fatalf("want both fields named, got %v", err)
	}
}

func TestValidateCheckpoint(t *testing.T) {
	for _, c := range []struct {
		root       string
		perPod     int
		total      int64
		wantFields []string
	}{
		{"relative/dir", 3, 0, []string{"checkpoint.root"}},
		{"/", 3, 0, []string{"checkpoint.root"}},
		{"/var/lib/x", -1, -5, []string{"checkpoint.max_per_pod", "checkpoint.max_total_bytes"}},
	} {
		cfg := DefaultConfig()
		cfg.Checkpoint = CheckpointConfig{Root: c.root, MaxPerPod: c.perPod, MaxTotalBytes: c.total}
		err := cfg.Validate()
		for _, f := range c.wantFields {
			if err == nil || !strings.Contains(err.Error(), f) {
				t.Errorf("%+v: %v does not name %s", c, err, f)
			}
		}
	}
	cfg := DefaultConfig()
	cfg.Checkpoint.MaxPerPod, cfg.Checkpoint.MaxTotalBytes = 0, 0
	if err := cfg.Validate(); err != nil {
		t.Fatalf("0 (unbounded) refused: %v", err)
	}
}

// The allow-list is directional and exact: no pair is implied by another.
func TestRestoreAllowed(t *testing.T) {
	c := DefaultConfig().Checkpoint
	if c.RestoreAllowed("a", "b") || len(c.RestoreNamespaceAllow) != 0 {
		t.Fatal("the default allows a pair")
	}
	c.RestoreNamespaceAllow = []NamespacePair{{From: "staging", To: "ci"}}
	for _, tc := range []struct {
		from, to string
		want     bool
	}{{"staging", "ci", true}, {"ci", "staging", false}, {"staging", "staging", false}, {"staging", "cix", false}, {"", "", false}} {
		if got := c.RestoreAllowed(tc.from, tc.to); got != tc.want {
			t.Errorf("RestoreAllowed(%q, %q) = %v, want %v", tc.from, tc.to, got, tc.want)
		}
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "absent.toml")
	if c, err := Load(missing, false); err != nil || !reflect.DeepEqual(c, DefaultConfig()) {
		t.Fatalf("absent default file: %v", err)
	}
	if _, err := Load(missing, true); err == nil {
		t.Fatal("absent file named with --config was accepted")
	}
	p := filepath.Join(dir, "c.toml")
	if err := os.WriteFile(p, []byte("[server]\nshutdown_timeout = \"3s\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := Load(p, true)
	if err != nil || c.Server.ShutdownTimeout.Duration != 3*time.Second || c.Server.Listen != DefaultConfig().Server.Listen {
		t.Fatalf("partial file: %+v %v", c, err)
	}
}

func TestMarshalRoundTrips(t *testing.T) {
	b, err := Marshal(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	var c Config
	if err := Decode(b, &c); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c, DefaultConfig()) {
		t.Fatalf("round trip changed the config: %+v", c)
	}
}

// FuzzDecode: no input may crash the parser or the validator.
func FuzzDecode(f *testing.F) {
	b, _ := Marshal(DefaultConfig())
	f.Add(b)
	f.Add([]byte("[server]\nlisten = 3\n"))
	f.Add([]byte("[[server]]\n"))
	f.Add([]byte("state_dir = \"\\u0000\"\n"))
	f.Add([]byte("[runtime]\nreconnect_max_delay = \"-9223372036854775808ns\"\n"))
	f.Add([]byte("[server]\ntimer_slack = \"9223372036854775807ns\"\n"))
	f.Add([]byte("[checkpoint]\nrestore_namespace_allow = [{from = \"a\", to = \"b\"}, {from = \"\", to = \"../x\"}]\n"))
	f.Add([]byte("[[checkpoint.restore_namespace_allow]]\nfrom = 1\n"))
	f.Add([]byte("[[checkpoint.registries]]\nhost = 1\nbogus = [1, {a = 2}]\n[backoff]\ninitial_delay = 10\n"))
	f.Add([]byte("server = [[1], {x = 1979-05-27T07:32:00Z}]\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		c := DefaultConfig()
		if err := Decode(in, &c); err != nil {
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
			return
		}
		_ = c.Validate()
	})
}

func TestKubernetesNode(t *testing.T) {
	if n, err := (KubernetesConfig{NodeName: "node-a"}).Node(); err != nil || n != "node-a" {
		t.Fatalf("node_name set: %q, %v", n, err)
	}
	h, err := os.Hostname()
	if err != nil {
		t.Skip("no hostname")
	}
	if n, err := (KubernetesConfig{}).Node(); err != nil || n != strings.ToLower(strings.TrimSpace(h)) {
		t.Fatalf("node_name empty: %q, %v; hostname %q", n, err, h)
	}
	if (KubernetesConfig{}).Enabled() || !(KubernetesConfig{Kubeconfig: "/k"}).Enabled() {
		t.Fatal("Enabled must follow kubeconfig")
	}
}

func TestValidateMetrics(t *testing.T) {
	for _, tc := range []struct {
		address   string
		profiling bool
		wantErr   string
	}{
		{"", false, ""},
		{"", true, ""}, // nothing served, nothing exposed
		{"127.0.0.1:9464", true, ""},
		{"127.9.9.9:9464", true, ""},
		{"[::1]:9464", true, ""},
		{"localhost:9464", true, ""},
		{"0.0.0.0:9464", false, ""},
		{"node.example:9464", false, ""},
		{"0.0.0.0:9464", true, `metrics.profiling: serves /debug/pprof on metrics.address "0.0.0.0:9464", which is not a loopback address`},
		{"[::]:9464", true, "metrics.profiling"},
		{":9464", true, "metrics.profiling"},
		{"node.example:9464", true, "metrics.profiling"},
		{"127.0.0.1", false, `metrics.address: must be host:port like "127.0.0.1:9464" or empty (disabled), got "127.0.0.1"`},
		{"::1:9464", false, "metrics.address: must be host:port"},
		{"127.0.0.1:0", false, `metrics.address: port "0" must be a number from 1 to 65535`},
		{"127.0.0.1:65536", false, `metrics.address: port "65536"`},
		{"127.0.0.1:-1", false, `metrics.address: port "-1"`},
		{"127.0.0.1:http", false, `metrics.address: port "http"`},
	} {
		c := DefaultConfig()
		c.Metrics = MetricsConfig{Address: tc.address, Profiling: tc.profiling}
		err := c.Validate()
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%+v: %v", c.Metrics, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%+v: got %v, want %q", c.Metrics, err, tc.wantErr)
		}
	}
}
