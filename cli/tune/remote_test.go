package tune

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/nodectl/nodectl/cli/internal/remote"
)

// A tuner pod's log holds its standard error with the result: the JSON is found after it,
// indented (status) or on one line (apply).
func TestDecodeFromLog(t *testing.T) {
	var st struct {
		Applied bool   `json:"applied"`
		Profile string `json:"profile"`
	}
	log := "time=x level=WARN msg=\"journald not restarted\"\n{\n  \"applied\": true,\n  \"profile\": \"sandbox-density\"\n}\n"
	if err := decodeFromLog([]byte(log), &st); err != nil || !st.Applied || st.Profile != "sandbox-density" {
		t.Errorf("decodeFromLog = %v, %+v", err, st)
	}
	var res struct {
		Changed []string `json:"changed"`
	}
	if err := decodeFromLog([]byte("{broken\n{\"changed\":[\"sysctl:vm.swappiness\"],\"held\":[]}\n"), &res); err != nil || len(res.Changed) != 1 {
		t.Errorf("decodeFromLog = %v, %+v", err, res)
	}
	if err := decodeFromLog([]byte("nodectl tune apply needs root\n"), &res); err == nil || !strings.Contains(err.Error(), "needs root") {
		t.Errorf("decodeFromLog of no JSON = %v, want the log quoted", err)
	}
}

// The tuner pod gets the flags given to the command, not the root's (--node), and a profile
// file's content with its name; a built-in goes by name.
func TestPassOn(t *testing.T) {
	file := filepath.Join(t.TempDir(), "p.yaml")
	if err := os.WriteFile(file, []byte("name: p\nsysctl:\n  vm.swappiness: 10\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		args, want []string
	}{
		"builtin": {[]string{"--node", "n1", "verify", "--profile", "sandbox-density", "-o", "json"}, []string{"--output=json", "--profile", "sandbox-density"}},
		"file":    {[]string{"--node", "n1", "plan", "--profile", file}, []string{"--profile", file, "--profile-yaml", "name: p\nsysctl:\n  vm.swappiness: 10\n"}},
		"bool":    {[]string{"--node", "n1", "rollback", "--missing-ok"}, []string{"--missing-ok=true"}},
	} {
		t.Run(name, func(t *testing.T) {
			root := &cobra.Command{Use: "nodectl"}
			remote.Register(root.PersistentFlags())
			tune := New()
			root.AddCommand(tune)
			var got []string
			for _, sub := range tune.Commands() {
				sub.RunE = func(cmd *cobra.Command, _ []string) error {
					var err error
					got, err = passOn(cmd)
					return err
				}
			}
			root.SetArgs(append([]string{tc.args[0], tc.args[1], "tune"}, tc.args[2:]...))
			if err := root.Execute(); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("passOn = %q, want %q", got, tc.want)
			}
		})
	}
}
