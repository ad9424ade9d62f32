package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshbox/meshbox/testing/meshtest"
)

// TestBashCompletion loads `meshbox completion bash` into a real bash, as
// a user's shell would, and completes partial command lines with it.
func TestBashCompletion(t *testing.T) {
	if testing.Short() {
		t.Skip("runs bash and the binary")
	}
	t.Parallel()
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatalf("bash: %v", err)
	}
	dir := t.TempDir()
	if err := os.Symlink(meshtest.Binary(t), filepath.Join(dir, "meshbox")); err != nil {
		t.Fatal(err)
	}
	complete := func(words ...string) []string {
		t.Helper()
		script := `source <(meshbox completion bash)
COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1))
_meshbox
printf '%s\n' "${COMPREPLY[@]}"`
		cmd := exec.Command(bash, append([]string{"-c", script, "bash", "meshbox"}, words...)...)
		cmd.Env = append(os.Environ(), "PATH="+dir+string(os.PathListSeparator)+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("complete %q: %v\n%s", words, err, out)
		}
		return strings.Fields(string(out))
	}
	cases := []struct {
		words []string
		want  []string
	}{
		{[]string{"pro"}, []string{"program"}},
		{[]string{"program", "a"}, []string{"add"}},
		{[]string{"call", "--ti"}, []string{"--timeout"}},
		{[]string{"mesh", "node", "set-"}, []string{"set-stages"}},
		{[]string{"mesh", "node", "add", "cellar", "--st"}, []string{"--stages"}},
		{[]string{"status", "--env"}, []string{"--env-file"}},
	}
	for _, c := range cases {
		if got := complete(c.words...); strings.Join(got, " ") != strings.Join(c.want, " ") {
			t.Errorf("meshbox %s<TAB>: got %q, want %q", strings.Join(c.words, " "), got, c.want)
		}
	}
}
