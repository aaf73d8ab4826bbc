package recorded

import (
	"strings"
	"testing"
)

// A directory that is not the agent's says so, not which file it lacks.
func TestReadMetaOfAnotherDirectory(t *testing.T) {
	dir := t.TempDir()
	if _, err := ReadMeta(dir); err == nil || !strings.Contains(err.Error(), dir+" is not an agent's data directory") {
		t.Errorf("ReadMeta of an empty directory: %v", err)
	}
}
