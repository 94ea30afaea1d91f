package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The Prometheus alert rules and the Grafana dashboard in deploy/monitoring:
// the rules pass `promtool check rules` and their unit tests (`promtool test
// rules`); every dashboard query is valid PromQL (checked as a recording
// rule); every cri_shim_ metric either names exists in the shim's code.
func TestMonitoringRulesAndDashboard(t *testing.T) {
	repo, _ := filepath.Abs("../..")
	dir := filepath.Join(repo, "deploy/monitoring")
	promtool := func(args ...string) {
		t.Helper()
		cmd := exec.Command("promtool", args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	promtool("check", "rules", "cri-shim-alerts.yaml")
	promtool("test", "rules", "cri-shim-alerts.test.yaml")

	b, err := os.ReadFile(filepath.Join(dir, "cri-shim-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	if len(dash.Panels) == 0 {
		t.Fatal("dashboard has no panels")
	}
	// Grafana's variables, replaced by what they stand for, make each query
	// a recording rule promtool can check.
	var rules strings.Builder
	rules.WriteString("groups:\n- name: dashboard\n  rules:\n")
	var exprs []string
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			e := strings.NewReplacer("$__rate_interval", "5m", "$instance", ".*").Replace(tg.Expr)
			exprs = append(exprs, tg.Expr)
			q, _ := json.Marshal(e)
			rules.WriteString("  - record: dashboard:query\n    expr: " + string(q) + "\n")
		}
	}
	f := filepath.Join(t.TempDir(), "dashboard-rules.yaml")
	if err := os.WriteFile(f, []byte(rules.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	promtool("check", "rules", f)

	// Metric names the code registers.
	known := map[string]bool{}
	nameRE := regexp.MustCompile(`Name:\s*"(cri_shim_[a-z_]+)"`)
	_ = filepath.WalkDir(filepath.Join(repo, "internal"), func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go") {
			src, _ := os.ReadFile(p)
			for _, m := range nameRE.FindAllStringSubmatch(string(src), -1) {
				known[m[1]] = true
			}
		}
		return nil
	})
	alerts, _ := os.ReadFile(filepath.Join(dir, "cri-shim-alerts.yaml"))
	used := regexp.MustCompile(`cri_shim_[a-z_]+`).FindAllString(string(alerts)+strings.Join(exprs, "\n"), -1)
	for _, m := range used {
		base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, "_bucket"), "_count"), "_sum")
		if !known[m] && !known[base] {
			t.Errorf("%s is not a metric the shim registers", m)
		}
	}
	t.Logf("%d alert rules, %d dashboard panels, %d queries; %d metric references checked", strings.Count(string(alerts), "- alert:"),
		len(dash.Panels), len(exprs), len(used))
}
