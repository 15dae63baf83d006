package source

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode"

	yamlv3 "go.yaml.in/yaml/v3"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// The kinds a services file may hold, and the apiVersion each must have.
const (
	kindService       = "Service"
	kindEndpointSlice = "EndpointSlice"
	kindList          = "List"

	apiVersionService       = "v1"
	apiVersionEndpointSlice = "discovery.k8s.io/v1"
	apiVersionList          = "v1"
)

// maxProblems caps how many problems one file reports; the rest are
// counted.
const maxProblems = 20

// ParseError is one problem found in a services file. ParseObjects returns
// these joined with errors.Join; use errors.As to get the first one.
type ParseError struct {
	// File is the name the file was parsed under.
	File string
	// Line is the 1-based line of the problem when it is known, else of
	// the object (or document) the problem is in.
	Line int
	// Document is the 1-based number of the YAML document in the stream.
	// A leading part that is blank or holds only comments before the
	// first "---" is not a document.
	Document int
	// Item is the 0-based index in the items of a List document, or -1
	// when the document itself holds the object.
	Item int
	// Kind, Namespace and Name identify the object, as far as they are
	// known. Namespace is "default" for Services and EndpointSlices that
	// give none.
	Kind      string
	Namespace string
	Name      string
	// Err is the problem itself.
	Err error
}

// Error formats the problem as
//
//	services.yaml:14: document 3 (Service default/web): unknown field "spec.portz"
//	services.yaml:40: document 1, items[2] (EndpointSlice default/web-x): ...
func (e *ParseError) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(e.Line))
	}
	fmt.Fprintf(&b, ": document %d", e.Document)
	if e.Item >= 0 {
		fmt.Fprintf(&b, ", items[%d]", e.Item)
	}
	if id := e.object(); id != "" {
		b.WriteString(" (")
		b.WriteString(id)
		b.WriteByte(')')
	}
	b.WriteString(": ")
	if e.Err != nil {
		// One line per problem.
		b.WriteString(strings.ReplaceAll(e.Err.Error(), "\n", `\n`))
	} else {
		b.WriteString("invalid")
	}
	return b.String()
}

func (e *ParseError) object() string {
	kind, ns, name := printable(e.Kind), printable(e.Namespace), printable(e.Name)
	if name != "" && ns != "" {
		name = ns + "/" + name
	}
	switch {
	case kind != "" && name != "":
		return kind + " " + name
	case kind != "":
		return kind
	default:
		return name
	}
}

// printable quotes a string that would garble a message.
func printable(s string) string {
	if strings.ContainsFunc(s, func(r rune) bool { return !unicode.IsPrint(r) || r == ' ' }) {
		return strconv.Quote(s)
	}
	return s
}

// Unwrap returns the underlying problem.
func (e *ParseError) Unwrap() error { return e.Err }

// ParseObjects parses a services file: a stream of YAML documents separated
// by "---" lines, each holding a Service (apiVersion v1), an EndpointSlice
// (apiVersion discovery.k8s.io/v1) or a List (apiVersion v1) whose items are
// such objects, as "kubectl get -o yaml" prints them. Empty documents are
// skipped. Objects without a namespace get "default".
//
// Parsing is strict: unknown or duplicate fields, values of the wrong type,
// a missing kind, apiVersion or metadata.name, other kinds and two objects
// with the same kind, namespace and name are errors. name is used in error
// messages only. On error the result holds no objects and err joins one
// *ParseError per problem (at most 20 are listed). Objects are returned in
// file order and are not filtered by service-proxy-name or headless labels.
func ParseObjects(name string, data []byte) (svcs []*corev1.Service, slices []*discoveryv1.EndpointSlice, err error) {
	p := parser{file: name, seen: make(map[ident]location)}
	for _, d := range splitDocuments(data) {
		p.document(d)
	}
	if err := p.err(); err != nil {
		return nil, nil, err
	}
	return p.services, p.slices, nil
}

// document is one YAML document of a stream.
type document struct {
	number int    // 1-based
	line   int    // file line of data's first line
	data   []byte // the document's text
}

var utf8BOM = []byte("\xef\xbb\xbf")

// splitDocuments splits a YAML stream at "---" lines (and "..." document
// end markers). Text after "---" on the separator line belongs to the
// following document.
func splitDocuments(data []byte) []document {
	data = bytes.TrimPrefix(data, utf8BOM)
	type chunk struct {
		line int
		data []byte
		// explicit is set for a chunk started by "---"; others (at the
		// start, or after a "..." end marker) are documents only when
		// they hold more than comments.
		explicit bool
	}
	var chunks []chunk
	cur := chunk{line: 1}
	start, line := 0, 1
	for off := 0; off < len(data); line++ {
		end := bytes.IndexByte(data[off:], '\n')
		next := len(data)
		if end >= 0 {
			next = off + end + 1
		}
		text := bytes.TrimRight(data[off:next], "\r\n")
		switch {
		case isSeparator(text):
			cur.data = data[start:off]
			chunks = append(chunks, cur)
			cur = chunk{line: line, explicit: true}
			start = off + 3
		case string(text) == "...":
			cur.data = data[start:off]
			chunks = append(chunks, cur)
			cur = chunk{line: line + 1}
			start = next
		}
		off = next
	}
	cur.data = data[start:]
	chunks = append(chunks, cur)

	var docs []document
	for _, c := range chunks {
		if !c.explicit && blank(c.data) {
			continue
		}
		docs = append(docs, document{number: len(docs) + 1, line: c.line, data: c.data})
	}
	return docs
}

func isSeparator(line []byte) bool {
	if !bytes.HasPrefix(line, []byte("---")) {
		return false
	}
	return len(line) == 3 || line[3] == ' ' || line[3] == '\t'
}

// blank reports whether a YAML text holds only whitespace and comments.
func blank(data []byte) bool {
	for line := range bytes.Lines(data) {
		line = bytes.TrimSpace(line)
		if len(line) > 0 && line[0] != '#' {
			return false
		}
	}
	return true
}

// location is where an object is in the file.
type location struct {
	doc  int // document number
	item int // index in a List's items, or -1
	line int // file line of the object's first line
	base int // file line of the document's first line
}

func (l location) String() string {
	s := fmt.Sprintf("document %d", l.doc)
	if l.item >= 0 {
		s += fmt.Sprintf(", items[%d]", l.item)
	}
	return s + fmt.Sprintf(" at line %d", l.line)
}

// fileLine converts a line of the document's text to a line of the file.
func (l location) fileLine(n *yamlv3.Node) int {
	return l.base + n.Line - 1
}

// ident is what is known of an object's identity; complete, it tells
// duplicates.
type ident struct {
	kind, namespace, name string
}

type parser struct {
	file     string
	services []*corev1.Service
	slices   []*discoveryv1.EndpointSlice
	seen     map[ident]location
	problems []error
	dropped  int
}

func (p *parser) problem(l location, line int, id ident, err error) {
	if len(p.problems) >= maxProblems {
		p.dropped++
		return
	}
	if line <= 0 {
		line = l.line
	}
	p.problems = append(p.problems, &ParseError{
		File: p.file, Line: line, Document: l.doc, Item: l.item,
		Kind: id.kind, Namespace: id.namespace, Name: id.name,
		Err: err,
	})
}

func (p *parser) err() error {
	if len(p.problems) == 0 {
		return nil
	}
	errs := p.problems
	if p.dropped > 0 {
		errs = append(errs[:len(errs):len(errs)], fmt.Errorf("%s: %d more problems not shown", p.file, p.dropped))
	}
	return errors.Join(errs...)
}

// yamlLine matches the line numbers in the YAML decoder's errors.
var yamlLine = regexp.MustCompile(`line (\d+): ([^\n]*)`)

func (p *parser) document(d document) {
	l := location{doc: d.number, item: -1, line: d.line, base: d.line}
	j, err := yaml.YAMLToJSONStrict(d.data)
	if err != nil {
		msg := err.Error()
		matches := yamlLine.FindAllStringSubmatch(msg, -1)
		if len(matches) == 0 {
			p.problem(l, 0, ident{}, fmt.Errorf("invalid YAML: %s", strings.TrimPrefix(msg, "yaml: ")))
			return
		}
		for _, m := range matches {
			n, _ := strconv.Atoi(m[1])
			p.problem(l, d.line+n-1, ident{}, fmt.Errorf("invalid YAML: %s", m[2]))
		}
		return
	}
	if isNull(j) {
		return // an empty document
	}
	// The node tree only serves to find the lines of fields named in
	// decoding errors; the decoding itself uses j.
	var root *yamlv3.Node
	var doc yamlv3.Node
	if yamlv3.Unmarshal(d.data, &doc) == nil && doc.Kind == yamlv3.DocumentNode && len(doc.Content) == 1 {
		root = deref(doc.Content[0])
		l.line = l.fileLine(root)
	}
	p.object(l, j, root)
}

func isNull(j []byte) bool {
	j = bytes.TrimSpace(j)
	return len(j) == 0 || string(j) == "null"
}

// object parses one document or List item.
func (p *parser) object(l location, j []byte, node *yamlv3.Node) {
	var head map[string]any
	if err := json.Unmarshal(j, &head); err != nil || head == nil {
		p.problem(l, 0, ident{}, fmt.Errorf("want an object with kind, apiVersion and metadata, got %s", jsonKind(j)))
		return
	}
	kind, _ := head["kind"].(string)
	apiVersion, _ := head["apiVersion"].(string)
	meta, _ := head["metadata"].(map[string]any)
	name, _ := meta["name"].(string)
	namespace, _ := meta["namespace"].(string)
	id := ident{kind: kind, namespace: namespace, name: name}

	switch kind {
	case "":
		p.problem(l, 0, id, errors.New("kind is required"))
	case kindList:
		if l.item >= 0 {
			p.problem(l, 0, ident{kind: kind}, errors.New("a List inside a List is not supported"))
			return
		}
		p.list(l, apiVersion, j, node)
	case kindService:
		p.typed(l, id, apiVersion, apiVersionService, j, node)
	case kindEndpointSlice:
		p.typed(l, id, apiVersion, apiVersionEndpointSlice, j, node)
	default:
		p.problem(l, 0, id, fmt.Errorf("unsupported kind %q: want %s, %s or %s", kind, kindService, kindEndpointSlice, kindList))
	}
}

// jsonKind names the JSON type of a value for messages.
func jsonKind(j []byte) string {
	j = bytes.TrimSpace(j)
	if len(j) == 0 {
		return "nothing"
	}
	switch j[0] {
	case '[':
		return "a list"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	case '{':
		return "an object"
	}
	return "a number"
}

// checkAPIVersion reports a missing or wrong apiVersion; it returns false
// when the object must not be decoded further.
func (p *parser) checkAPIVersion(l location, id ident, got, want string) bool {
	switch got {
	case want:
		return true
	case "":
		p.problem(l, 0, id, errors.New("apiVersion is required"))
		return true
	}
	p.problem(l, 0, id, fmt.Errorf("unsupported apiVersion %q for kind %s: want %s", got, id.kind, want))
	return false
}

// typed decodes a Service or an EndpointSlice.
func (p *parser) typed(l location, id ident, apiVersion, wantAPIVersion string, j []byte, node *yamlv3.Node) {
	if id.namespace == "" {
		id.namespace = metav1.NamespaceDefault
	}
	ok := p.checkAPIVersion(l, id, apiVersion, wantAPIVersion)
	if !ok {
		return
	}
	if id.name == "" {
		p.problem(l, 0, id, errors.New("metadata.name is required"))
		ok = false
	}

	var obj metav1.Object
	switch id.kind {
	case kindService:
		obj = &corev1.Service{}
	default:
		obj = &discoveryv1.EndpointSlice{}
	}
	if !p.decode(l, id, j, obj, node) {
		ok = false
	}
	if id.name != "" {
		if first, dup := p.seen[id]; dup {
			p.problem(l, 0, id, fmt.Errorf("duplicate object, first defined in %v", first))
			ok = false
		} else {
			p.seen[id] = l
		}
	}
	if !ok {
		return
	}
	obj.SetNamespace(id.namespace)
	switch o := obj.(type) {
	case *corev1.Service:
		p.services = append(p.services, o)
	case *discoveryv1.EndpointSlice:
		p.slices = append(p.slices, o)
	}
}

// list decodes a List and the objects in its items.
func (p *parser) list(l location, apiVersion string, j []byte, node *yamlv3.Node) {
	id := ident{kind: kindList}
	if !p.checkAPIVersion(l, id, apiVersion, apiVersionList) {
		return
	}
	var lst struct {
		APIVersion string            `json:"apiVersion"`
		Kind       string            `json:"kind"`
		Metadata   metav1.ListMeta   `json:"metadata"`
		Items      []json.RawMessage `json:"items"`
	}
	if !p.decode(l, id, j, &lst, node) {
		return
	}
	var items *yamlv3.Node
	if _, v := field(node, "items"); v != nil && v.Kind == yamlv3.SequenceNode && len(v.Content) == len(lst.Items) {
		items = v
	}
	for i, raw := range lst.Items {
		il := l
		il.item = i
		var itemNode *yamlv3.Node
		if items != nil {
			itemNode = deref(items.Content[i])
			il.line = l.fileLine(itemNode)
		}
		p.object(il, raw, itemNode)
	}
}

// strictField matches the strict decoder's messages.
var strictField = regexp.MustCompile(`^(?:unknown|duplicate) field "(.*)"$`)

// decode decodes j strictly into v and reports every problem, with the
// line of the field involved where it can be found. It returns whether v
// was decoded without problems.
func (p *parser) decode(l location, id ident, j []byte, v any, node *yamlv3.Node) bool {
	strict, err := kjson.UnmarshalStrict(j, v)
	if err != nil {
		path, msg := describeDecodeError(err)
		p.problem(l, p.lineOf(l, node, path), id, errors.New(msg))
		return false
	}
	// The decoder reports fields in key order; report them in file order.
	lines := make([]int, len(strict))
	for i, se := range strict {
		if m := strictField.FindStringSubmatch(se.Error()); m != nil {
			lines[i] = p.lineOf(l, node, m[1])
		}
	}
	order := make([]int, len(strict))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return lines[order[a]] < lines[order[b]] })
	for _, i := range order {
		p.problem(l, lines[i], id, strict[i])
	}
	return len(strict) == 0
}

// lineOf returns the file line of the field at path in node, or 0.
func (p *parser) lineOf(l location, node *yamlv3.Node, path string) int {
	if path == "" || node == nil {
		return 0
	}
	if n := locate(node, path); n != nil {
		return l.fileLine(n)
	}
	return 0
}

// describeDecodeError turns a JSON decoding error into a message with the
// field path, and returns the path.
func describeDecodeError(err error) (path, msg string) {
	// Type errors of encoding/json and of its Kubernetes variant share
	// these fields.
	v := reflect.ValueOf(err)
	if v.Kind() == reflect.Pointer && !v.IsNil() {
		v = v.Elem()
	}
	if v.Kind() == reflect.Struct {
		fv, vv, tv := v.FieldByName("Field"), v.FieldByName("Value"), v.FieldByName("Type")
		if fv.Kind() == reflect.String && vv.Kind() == reflect.String && tv.IsValid() && tv.CanInterface() {
			if t, ok := tv.Interface().(reflect.Type); ok && t != nil {
				got := describeJSONValue(vv.String())
				if fv.String() == "" {
					return "", fmt.Sprintf("want %s, got %s", describeGoType(t), got)
				}
				return fv.String(), fmt.Sprintf("field %q: want %s, got %s", fv.String(), describeGoType(t), got)
			}
		}
	}
	return "", strings.TrimPrefix(err.Error(), "json: ")
}

// describeJSONValue rewords the decoder's description of a JSON value.
func describeJSONValue(s string) string {
	switch s {
	case "array":
		return "a list"
	case "object":
		return "an object"
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	case "number":
		return "a number"
	}
	return s // e.g. "number 99999999999"
}

// describeGoType names what JSON a Go type takes.
func describeGoType(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return "a base64 string"
		}
		return "a list"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return t.Kind().String()
	}
	return t.String()
}

// deref follows aliases.
func deref(n *yamlv3.Node) *yamlv3.Node {
	for n != nil && n.Kind == yamlv3.AliasNode {
		n = n.Alias
	}
	return n
}

// field returns the key and value nodes of a mapping's entry.
func field(n *yamlv3.Node, key string) (k, v *yamlv3.Node) {
	n = deref(n)
	if n == nil || n.Kind != yamlv3.MappingNode {
		return nil, nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i], deref(n.Content[i+1])
		}
	}
	return nil, nil
}

// locate finds the node a decoder field path such as "spec.ports[0].name"
// points to: the key node of its last element. A path without indices
// ("spec.ports.name") matches the field in every list element; it is found
// only when exactly one element has it.
func locate(root *yamlv3.Node, path string) *yamlv3.Node {
	type match struct{ key, val *yamlv3.Node }
	cur := []match{{val: root}}
	for _, seg := range strings.Split(path, ".") {
		name, indices, _ := strings.Cut(seg, "[")
		var next []match
		for _, m := range cur {
			vals := []*yamlv3.Node{m.val}
			if m.val.Kind == yamlv3.SequenceNode {
				vals = nil
				for _, c := range m.val.Content {
					vals = append(vals, deref(c))
				}
			}
			for _, v := range vals {
				if k, val := field(v, name); k != nil {
					next = append(next, match{k, val})
				}
			}
		}
		if indices != "" {
			for _, ix := range strings.Split(strings.TrimSuffix(indices, "]"), "][") {
				i, err := strconv.Atoi(ix)
				if err != nil {
					return nil
				}
				var indexed []match
				for _, m := range next {
					if m.val.Kind == yamlv3.SequenceNode && i >= 0 && i < len(m.val.Content) {
						el := deref(m.val.Content[i])
						indexed = append(indexed, match{el, el})
					}
				}
				next = indexed
			}
		}
		if len(next) == 0 {
			return nil
		}
		cur = next
	}
	if len(cur) != 1 || cur[0].key == nil {
		return nil
	}
	return cur[0].key
}
