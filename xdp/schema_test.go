package xdp

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strings"
	"testing"
)

// generatedSchemaNames are bpf2go's types that are not part of the
// schema: the object's own specs, maps, programs and variables.
var generatedSchemaNames = map[string]bool{
	"NicSpecs": true, "NicProgramSpecs": true, "NicMapSpecs": true, "NicVariableSpecs": true,
	"NicObjects": true, "NicMaps": true, "NicVariables": true, "NicPrograms": true,
}

// Every schema type and enum value bpf2go generates (Nic...) has its
// name without the prefix in schema.go, aliasing it: a -type added to
// gen.go without one fails here rather than leaving code to use the
// prefixed name.
func TestSchemaNamesAliasEveryGeneratedName(t *testing.T) {
	fset := token.NewFileSet()
	gen, err := parser.ParseFile(fset, "nic_bpfel.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	schema, err := parser.ParseFile(fset, "schema.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	aliases := map[string]string{} // unprefixed name -> what it stands for
	ast.Inspect(schema, func(n ast.Node) bool {
		switch s := n.(type) {
		case *ast.TypeSpec:
			if id, ok := s.Type.(*ast.Ident); ok && s.Assign.IsValid() {
				aliases[s.Name.Name] = id.Name
			}
		case *ast.ValueSpec:
			for i, name := range s.Names {
				if i < len(s.Values) {
					if id, ok := s.Values[i].(*ast.Ident); ok {
						aliases[name.Name] = id.Name
					}
				}
			}
		}
		return true
	})
	checked := 0
	ast.Inspect(gen, func(n ast.Node) bool {
		var names []string
		switch s := n.(type) {
		case *ast.TypeSpec:
			names = []string{s.Name.Name}
		case *ast.ValueSpec:
			for i, id := range s.Names {
				// The names of maps and programs are strings, not schema.
				if i < len(s.Values) {
					if lit, ok := s.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						continue
					}
				}
				names = append(names, id.Name)
			}
		}
		for _, name := range names {
			if !strings.HasPrefix(name, "Nic") || generatedSchemaNames[name] {
				continue
			}
			checked++
			short := strings.TrimPrefix(name, "Nic")
			if aliases[short] != name {
				t.Errorf("schema.go has no %s = %s", short, name)
			}
		}
		return true
	})
	if checked < 20 {
		t.Fatalf("only %d generated schema names found in nic_bpfel.go", checked)
	}
}
