// Command mkimage wraps a static binary into a one-layer container image and writes it as a
// docker-archive tar, which `ctr -n k8s.io images import` and `docker load` read: no Docker
// daemon and no registry are needed (`make image`). The image is reproducible: every time
// stamp is fixed, so the same binary gives the same image digest.
//
//	mkimage -binary bin/nodectl -tag nodectl:v1 -version v1 -out bin/nodectl-image.tar
package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/nodectl/nodectl/internal/atomicfile"
)

// epoch is every time stamp of the image (files and config): the Unix epoch, as
// SOURCE_DATE_EPOCH=0 would give, so that rebuilding the same binary gives the same digest.
var epoch = time.Unix(0, 0).UTC()

// Config is what goes into the image.
type Config struct {
	Binary  []byte // a static ELF executable
	Name    string // its name in /usr/local/bin and the entrypoint's
	Version string // the org.opencontainers.image.version label
}

// binDir is where the binary goes, on the image's PATH.
const binDir = "/usr/local/bin"

// passwd and group name root and nobody: Go's os/user and the runtime's USER lookups want them.
const (
	passwd = "root:x:0:0:root:/:/sbin/nologin\nnobody:x:65534:65534:nobody:/:/sbin/nologin\n"
	group  = "root:x:0:\nnogroup:x:65534:\n"
)

// Build makes the image: one layer holding the binary, /etc/passwd, /etc/group and /tmp.
func Build(cfg Config) (v1.Image, error) {
	arch, err := staticArch(cfg.Binary)
	if err != nil {
		return nil, err
	}
	if cfg.Name == "" || path.Base(cfg.Name) != cfg.Name {
		return nil, fmt.Errorf("binary name %q: want a plain file name", cfg.Name)
	}
	layerTar, err := rootfs(cfg)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return nil, fmt.Errorf("making the layer: %w", err)
	}
	img, err := mutate.Append(empty.Image, mutate.Addendum{Layer: layer, History: v1.History{
		Created: v1.Time{Time: epoch}, CreatedBy: "mkimage: " + path.Join(binDir, cfg.Name),
	}})
	if err != nil {
		return nil, fmt.Errorf("adding the layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("reading the image's config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	cf.Created = v1.Time{Time: epoch}
	cf.Config.Entrypoint = []string{path.Join(binDir, cfg.Name)}
	cf.Config.Env = []string{"PATH=" + binDir + ":/usr/bin:/bin"}
	cf.Config.WorkingDir = "/"
	cf.Config.Labels = map[string]string{
		"org.opencontainers.image.title":   cfg.Name,
		"org.opencontainers.image.version": cfg.Version,
		"org.opencontainers.image.source":  "https://github.com/nodectl/nodectl",
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("setting the image's config: %w", err)
	}
	return img, nil
}

// elfArch maps ELF machines to the image architectures we build for.
var elfArch = map[elf.Machine]string{elf.EM_X86_64: "amd64", elf.EM_AARCH64: "arm64"}

// staticArch is the image architecture of a static ELF executable; a dynamic one is refused,
// since the image has no C library or loader.
func staticArch(b []byte) (string, error) {
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return "", fmt.Errorf("reading the binary: %w", err)
	}
	defer f.Close()
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return "", fmt.Errorf("the binary is an ELF %s, not an executable", f.Type)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return "", errors.New("the binary is dynamically linked (build it with CGO_ENABLED=0): the image has no C library")
		}
	}
	arch, ok := elfArch[f.Machine]
	if !ok {
		return "", fmt.Errorf("the binary is for %s, which mkimage does not know", f.Machine)
	}
	return arch, nil
}

// rootfs is the layer's tar: directories first, every entry owned by root and stamped epoch.
func rootfs(cfg Config) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	entries := []struct {
		name string
		mode int64
		body []byte
		dir  bool
	}{
		{name: "etc/", mode: 0o755, dir: true},
		{name: "etc/group", mode: 0o644, body: []byte(group)},
		{name: "etc/passwd", mode: 0o644, body: []byte(passwd)},
		{name: "tmp/", mode: 0o1777, dir: true},
		{name: "usr/", mode: 0o755, dir: true},
		{name: "usr/local/", mode: 0o755, dir: true},
		{name: "usr/local/bin/", mode: 0o755, dir: true},
		{name: "usr/local/bin/" + cfg.Name, mode: 0o755, body: cfg.Binary},
	}
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, ModTime: epoch, Format: tar.FormatPAX, Typeflag: tar.TypeReg, Size: int64(len(e.body))}
		if e.dir {
			h.Typeflag, h.Size = tar.TypeDir, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("writing %s to the layer: %w", e.name, err)
		}
		if _, err := tw.Write(e.body); err != nil {
			return nil, fmt.Errorf("writing %s to the layer: %w", e.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("closing the layer: %w", err)
	}
	return buf.Bytes(), nil
}

// Write writes img to out as a docker-archive tagged tag, replaced whole (internal/atomicfile),
// so that a failed run leaves no half-written image.
func Write(out, tag string, img v1.Image) error {
	ref, err := name.NewTag(tag)
	if err != nil {
		return fmt.Errorf("tag %q: %w", tag, err)
	}
	f, err := atomicfile.Create(out, 0o644)
	if err != nil {
		return fmt.Errorf("writing the image: %w", err)
	}
	defer f.Abort()
	if err := tarball.Write(ref, img, f); err != nil {
		return fmt.Errorf("writing the image to %s: %w", out, err)
	}
	if err := f.Commit(); err != nil {
		return fmt.Errorf("writing the image: %w", err)
	}
	return nil
}

func main() {
	bin := flag.String("binary", "bin/nodectl", "the static binary to wrap")
	tag := flag.String("tag", "nodectl:dev", "the image's name and tag")
	version := flag.String("version", "dev", "the org.opencontainers.image.version label")
	out := flag.String("out", "bin/nodectl-image.tar", "the docker-archive tar to write")
	flag.Parse()
	if err := run(*bin, *tag, *version, *out); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run(bin, tag, version, out string) error {
	b, err := os.ReadFile(bin)
	if err != nil {
		return fmt.Errorf("reading the binary: %w", err)
	}
	img, err := Build(Config{Binary: b, Name: path.Base(bin), Version: version})
	if err != nil {
		return err
	}
	if err := Write(out, tag, img); err != nil {
		return err
	}
	// The config's digest is the image id containerd and docker show; the manifest's is
	// rebuilt by whoever imports the archive.
	id, err := img.ConfigName()
	if err != nil {
		return err
	}
	fmt.Printf("mkimage: %s (image id %s) written to %s\n", tag, id, out)
	return nil
}
