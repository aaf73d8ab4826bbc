package testcluster

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// PauseImage is the pod sandbox image the node's containerd is configured with. Its one
// binary also burns CPU when run as `/pause burn` (BurnCommand), so test pods use it too.
const PauseImage = "nodectl.local/pause:test"

// BurnCommand is a container command that spins on one CPU until stopped, in PauseImage.
var BurnCommand = []string{"/pause", "burn"}

// buildPauseImage builds testcluster/internal/pause (static) and writes it as a one-layer
// docker-archive tar at path, tagged PauseImage: there is no registry to pull from.
func buildPauseImage(ctx context.Context, dir, path string) error {
	bin := filepath.Join(dir, "pause")
	cmd := exec.CommandContext(ctx, goTool(), "build", "-trimpath", "-ldflags=-s -w", "-o", bin, "github.com/nodectl/nodectl/testcluster/internal/pause")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building the pause binary: %w: %s", err, out)
	}
	exe, err := os.ReadFile(bin)
	if err != nil {
		return fmt.Errorf("reading the pause binary: %w", err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: "pause", Mode: 0o755, Size: int64(len(exe)), Typeflag: tar.TypeReg}); err != nil {
		return fmt.Errorf("writing the pause layer: %w", err)
	}
	if _, err := tw.Write(exe); err != nil {
		return fmt.Errorf("writing the pause layer: %w", err)
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("writing the pause layer: %w", err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(buf.Bytes())), nil
	})
	if err != nil {
		return fmt.Errorf("making the pause layer: %w", err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return fmt.Errorf("making the pause image: %w", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("making the pause image: %w", err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", runtime.GOARCH
	cfg.Config = v1.Config{Entrypoint: []string{"/pause"}}
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return fmt.Errorf("making the pause image: %w", err)
	}
	tag, err := name.NewTag(PauseImage)
	if err != nil {
		return fmt.Errorf("naming the pause image: %w", err)
	}
	if err := tarball.WriteToFile(path, tag, img); err != nil {
		return fmt.Errorf("writing the pause image: %w", err)
	}
	return nil
}

// goTool is the go command: the one on PATH, else the toolchain that built this test.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}
