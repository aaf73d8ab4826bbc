package rundir_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// contractScope are the directories whose code writes or reads runs: the contract's strings
// there must come from this package. The tuner, the cgroup and BPF plumbing use words such as
// "cpu" or "memory" for other things (controllers, files), so they are out of scope. A
// directory ending in "/." is its own files only, not the packages below it.
var contractScope = []string{"stress", "analyzer", "record/trace", "record/sample", "record/collect", "record/.", "agent/exporter", "agent/."}

// contractConsts reads this package's string constants, by name: every name of the run format.
func contractConsts(t *testing.T) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, ".", func(fi fs.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
	if err != nil {
		t.Fatal(err)
	}
	consts := map[string]string{}
	for _, pkg := range pkgs {
		for _, f := range pkg.Files {
			for _, d := range f.Decls {
				gd, ok := d.(*ast.GenDecl)
				if !ok || gd.Tok != token.CONST {
					continue
				}
				for _, spec := range gd.Specs {
					vs := spec.(*ast.ValueSpec)
					for i, v := range vs.Values {
						lit, ok := v.(*ast.BasicLit)
						if !ok || lit.Kind != token.STRING {
							continue
						}
						s, _ := strconv.Unquote(lit.Value)
						consts[vs.Names[i].Name] = s
					}
				}
			}
		}
	}
	return consts
}

// TestNoContractLiteralOutside fails when code that writes or reads runs spells a name of the
// run format (a metric, a kind, a scenario, an event, a label) as a literal instead of using
// this package's constant: a rename would then compile and silently break analysis.
func TestNoContractLiteralOutside(t *testing.T) {
	consts := map[string]string{} // value -> a constant's name
	for name, v := range contractConsts(t) {
		if c, ok := consts[v]; !ok || name < c {
			consts[v] = name
		}
	}
	fset := token.NewFileSet()
	for _, dir := range contractScope {
		err := filepath.WalkDir(filepath.Join("..", dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			name := d.Name()
			if d.IsDir() && strings.HasSuffix(dir, "/.") && path != filepath.Join("..", dir) {
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") || strings.Contains(name, "_bpfe") {
				return nil
			}
			f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
			if err != nil {
				return err
			}
			// Lines marked //rundir:other use a word of the format for something else (a
			// kernel file's key, a cgroup file's value).
			otherMeaning := map[int]bool{}
			for _, cg := range f.Comments {
				for _, c := range cg.List {
					if strings.HasPrefix(c.Text, "//rundir:other") {
						otherMeaning[fset.Position(c.Pos()).Line] = true
					}
				}
			}
			lineOf := func(n ast.Node) int { return fset.Position(n.Pos()).Line }
			tags := map[*ast.BasicLit]bool{}
			ast.Inspect(f, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.CallExpr:
					// A log line's attribute keys are not the format.
					if sel, ok := n.Fun.(*ast.SelectorExpr); ok && slices.Contains(logMethods, sel.Sel.Name) {
						for _, a := range n.Args {
							if lit, ok := a.(*ast.BasicLit); ok {
								tags[lit] = true
							}
						}
					}
				case *ast.Field:
					if n.Tag != nil {
						tags[n.Tag] = true
					}
				case *ast.ImportSpec:
					tags[n.Path] = true
				case *ast.BasicLit:
					if n.Kind != token.STRING || tags[n] {
						return true
					}
					s, err := strconv.Unquote(n.Value)
					if err != nil {
						return true
					}
					if c, ok := consts[s]; ok && !otherMeaning[lineOf(n)] {
						t.Errorf("%s: %q is rundir.%s; use the constant", fset.Position(n.Pos()), s, c)
					}
				}
				return true
			})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// logMethods are slog's: their string arguments are messages and attribute keys.
var logMethods = []string{"Debug", "Info", "Warn", "Error", "Log"}
