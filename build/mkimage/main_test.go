package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// fakeELF is the smallest ELF64 executable debug/elf reads: a header and one program header,
// PT_LOAD (static) or PT_INTERP (dynamic), then a little code. Enough for mkimage's checks,
// which read the headers only.
func fakeELF(t *testing.T, machine elf.Machine, dynamic bool) []byte {
	t.Helper()
	var b bytes.Buffer
	h := elf.Header64{Type: uint16(elf.ET_EXEC), Machine: uint16(machine), Version: uint32(elf.EV_CURRENT),
		Entry: 0x400078, Phoff: 64, Ehsize: 64, Phentsize: 56, Phnum: 1}
	copy(h.Ident[:], elf.ELFMAG)
	h.Ident[elf.EI_CLASS], h.Ident[elf.EI_DATA], h.Ident[elf.EI_VERSION] = byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)
	p := elf.Prog64{Type: uint32(elf.PT_LOAD), Flags: uint32(elf.PF_R | elf.PF_X), Vaddr: 0x400000, Paddr: 0x400000, Filesz: 0x80, Memsz: 0x80, Align: 0x1000}
	if dynamic {
		p = elf.Prog64{Type: uint32(elf.PT_INTERP), Flags: uint32(elf.PF_R), Off: 0x78, Filesz: 8, Memsz: 8, Align: 1}
	}
	if err := binary.Write(&b, binary.LittleEndian, h); err != nil {
		t.Fatal(err)
	}
	if err := binary.Write(&b, binary.LittleEndian, p); err != nil {
		t.Fatal(err)
	}
	b.WriteString("/lib/ld\x00")
	return b.Bytes()
}

func writeFile(t *testing.T, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "nodectl")
	if err := os.WriteFile(p, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// The image read back as a runtime would: one layer with the binary, the entrypoint, the
// labels, the architecture of the binary, the tag in manifest.json.
func TestImageReadBack(t *testing.T) {
	exe := fakeELF(t, elf.EM_X86_64, false)
	bin := writeFile(t, exe)
	out := filepath.Join(t.TempDir(), "image.tar")
	if err := run(bin, "nodectl:v1.2.3", "v1.2.3", out); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(out + ".tmp"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temporary file left: %v", err)
	}
	tag, err := name.NewTag("nodectl:v1.2.3")
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(out, &tag)
	if err != nil {
		t.Fatal(err)
	}
	m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(out) })
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 1 || !slices.Equal(m[0].RepoTags, []string{"nodectl:v1.2.3"}) {
		t.Errorf("manifest.json: %+v, want one image tagged nodectl:v1.2.3", m)
	}

	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cf.Config.Entrypoint, []string{"/usr/local/bin/nodectl"}) {
		t.Errorf("entrypoint %q", cf.Config.Entrypoint)
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" {
		t.Errorf("platform %s/%s, want linux/amd64", cf.OS, cf.Architecture)
	}
	if v := cf.Config.Labels["org.opencontainers.image.version"]; v != "v1.2.3" {
		t.Errorf("version label %q", v)
	}
	if !cf.Created.Time.Equal(epoch) {
		t.Errorf("created %s, want %s", cf.Created.Time, epoch)
	}
	if !slices.ContainsFunc(cf.Config.Env, func(e string) bool { return strings.HasPrefix(e, "PATH=/usr/local/bin:") }) {
		t.Errorf("env %q: /usr/local/bin not first on PATH", cf.Config.Env)
	}

	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 1 || len(cf.RootFS.DiffIDs) != 1 {
		t.Fatalf("%d layers, %d diff ids: want 1", len(layers), len(cf.RootFS.DiffIDs))
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if !h.ModTime.Equal(epoch) || h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s: mtime %s, owner %d:%d; want %s, root", h.Name, h.ModTime, h.Uid, h.Gid, epoch)
		}
		switch h.Name {
		case "usr/local/bin/nodectl":
			body, _ := io.ReadAll(tr)
			if !bytes.Equal(body, exe) || h.Mode != 0o755 {
				t.Errorf("the binary: %d bytes mode %o, want the %d bytes given, mode 755", len(body), h.Mode, len(exe))
			}
		case "tmp/":
			if h.Mode != 0o1777 {
				t.Errorf("/tmp mode %o, want 1777", h.Mode)
			}
		case "etc/passwd":
			body, _ := io.ReadAll(tr)
			if !strings.HasPrefix(string(body), "root:x:0:0:") {
				t.Errorf("/etc/passwd: %q", body)
			}
		}
	}
	for _, want := range []string{"etc/passwd", "etc/group", "tmp/", "usr/local/bin/nodectl"} {
		if !slices.Contains(names, want) {
			t.Errorf("layer lacks %s: %q", want, names)
		}
	}
}

// The same binary gives the same bytes, so the same digest.
func TestImageReproducible(t *testing.T) {
	bin := writeFile(t, fakeELF(t, elf.EM_AARCH64, false))
	dir := t.TempDir()
	var got [2][]byte
	for i := range got {
		out := filepath.Join(dir, "image.tar")
		if err := run(bin, "nodectl:dev", "dev", out); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		got[i] = b
	}
	if !bytes.Equal(got[0], got[1]) {
		t.Error("two builds of the same binary differ")
	}
}

func TestBuildRefuses(t *testing.T) {
	for name, tc := range map[string]struct {
		bin  []byte
		name string
		want string
	}{
		"dynamic":        {bin: fakeELF(t, elf.EM_X86_64, true), name: "nodectl", want: "dynamically linked"},
		"not_elf":        {bin: []byte("#!/bin/sh\necho hi\n"), name: "nodectl", want: "reading the binary"},
		"unknown_arch":   {bin: fakeELF(t, elf.EM_MIPS, false), name: "nodectl", want: "does not know"},
		"name_with_path": {bin: fakeELF(t, elf.EM_X86_64, false), name: "bin/nodectl", want: "plain file name"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Build(Config{Binary: tc.bin, Name: tc.name, Version: "dev"})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
