package server

import (
	"fmt"
	"reflect"
	"strings"

	"go.yaml.in/yaml/v3"
)

// checkShape reports, by line and in the configuration's own words, the
// first node of n that does not fit t: a key that t (a struct) does not
// have, or a mapping, list or scalar where another kind belongs. It walks
// the same types the decoder fills, so that the decoder meets no type
// error afterwards; what a key is called and what it lists come from the
// types' yaml tags. noun names the node ("policies", "a route"), for the
// messages.
func checkShape(n *yaml.Node, t reflect.Type, noun string) error {
	return shape(n, t, noun, false)
}

// shape is checkShape; inAlias is set under an alias being checked.
func shape(n *yaml.Node, t reflect.Type, noun string, inAlias bool) error {
	if n.Kind == yaml.AliasNode {
		if inAlias || n.Alias == nil {
			// Aliases within an alias are not followed: aliases of
			// aliases may expand a small file into a huge tree, which
			// the decoder's own limit on aliasing then refuses. Each
			// walk through an alias is one walk of the anchored node,
			// and every anchored node is also checked where defined.
			return nil
		}
		// The anchored node, against the type of the place it is used.
		return shape(n.Alias, t, noun, true)
	}
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return nil
		}
		return shape(n.Content[0], t, noun, inAlias)
	}
	if n.Tag == "!!null" {
		return nil // the zero value
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	mismatch := func() error {
		got := n.Tag
		if n.Kind == yaml.ScalarNode {
			got += " `" + n.Value + "`"
		}
		return fmt.Errorf("%w: line %d: cannot unmarshal %s into %s", ErrConfig, n.Line, got, describe(t, noun))
	}
	switch {
	case t == reflect.TypeFor[Duration]():
		if n.Kind != yaml.ScalarNode {
			return mismatch()
		}
	case t.Kind() == reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return mismatch()
		}
		fields := yamlFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Tag == "!!merge" {
				if err := checkMerge(v, t, noun, inAlias); err != nil {
					return err
				}
				continue
			}
			f, ok := fields[k.Value]
			if !ok {
				where := "(a top-level key; see slidegate serve --print-config)"
				if t != reflect.TypeFor[Config]() {
					where = fmt.Sprintf("in %s (want %s)", noun, strings.Join(yamlNames(t), ", "))
				}
				return fmt.Errorf("%w: line %d: key %s not found %s", ErrConfig, k.Line, k.Value, where)
			}
			if err := shape(v, f.Type, k.Value, inAlias); err != nil {
				return err
			}
		}
	case t.Kind() == reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return mismatch()
		}
		for _, c := range n.Content {
			if err := shape(c, t.Elem(), elemNoun(t.Elem()), inAlias); err != nil {
				return err
			}
		}
	case t.Kind() == reflect.Map:
		if n.Kind != yaml.MappingNode {
			return mismatch()
		}
		for i := 1; i < len(n.Content); i += 2 {
			if n.Content[i-1].Tag == "!!merge" {
				if err := checkMerge(n.Content[i], t, noun, inAlias); err != nil {
					return err
				}
				continue
			}
			if err := shape(n.Content[i], t.Elem(), noun+"."+n.Content[i-1].Value, inAlias); err != nil {
				return err
			}
		}
	case t.Kind() == reflect.Interface:
		// Anything: store_options are the store's to check.
	default: // strings, numbers, switches; checkScalars checks their kind
		if n.Kind != yaml.ScalarNode {
			return mismatch()
		}
	}
	return nil
}

// checkMerge checks the value of a merge key (<<) in a mapping of type t:
// a mapping, an alias of one or a list of them, whose keys the decoder
// merges into the mapping that holds the merge key.
func checkMerge(v *yaml.Node, t reflect.Type, noun string, inAlias bool) error {
	if v.Kind != yaml.SequenceNode {
		return shape(v, t, noun, inAlias)
	}
	for _, c := range v.Content {
		if err := shape(c, t, noun, inAlias); err != nil {
			return err
		}
	}
	return nil
}

// describe says what a node of type t, called noun, must be.
func describe(t reflect.Type, noun string) string {
	names := func(t reflect.Type) string { return strings.Join(yamlNames(t), ", ") }
	var what string
	switch {
	case t == reflect.TypeFor[Config]():
		return "the configuration (a mapping of keys)"
	case t == reflect.TypeFor[Duration]():
		what = "a duration, such as 60s or 1m30s"
	case t.Kind() == reflect.Struct:
		what = "a mapping {" + names(t) + "}"
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Struct:
		what = "a list of {" + names(t.Elem()) + "}"
	case t.Kind() == reflect.Slice:
		what = "a list of strings"
	case t.Kind() == reflect.Map && t.Elem().Kind() == reflect.Slice:
		what = "a mapping from name to a list of {" + names(t.Elem().Elem()) + "}"
	case t.Kind() == reflect.Map:
		what = "a mapping"
	case t.Kind() == reflect.Bool:
		what = "true or false"
	case t.Kind() == reflect.String:
		what = "a string"
	default:
		what = "a whole number"
	}
	return noun + " (" + what + ")"
}

// elemNoun names one element of a list of t.
func elemNoun(t reflect.Type) string {
	switch t {
	case reflect.TypeFor[PolicyConfig]():
		return "a policy"
	case reflect.TypeFor[RouteConfig]():
		return "a route"
	case reflect.TypeFor[LimitConfig]():
		return "a limit"
	}
	return "an item"
}

// yamlFields maps the yaml keys of struct t to its fields.
func yamlFields(t reflect.Type) map[string]reflect.StructField {
	out := map[string]reflect.StructField{}
	for i := range t.NumField() {
		f := t.Field(i)
		if name := yamlName(f); name != "" {
			out[name] = f
		}
	}
	return out
}

// yamlNames lists the yaml keys of struct t, in order.
func yamlNames(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		if name := yamlName(t.Field(i)); name != "" {
			out = append(out, name)
		}
	}
	return out
}

// yamlName is the key of f in YAML; "" for a field YAML does not see.
func yamlName(f reflect.StructField) string {
	if !f.IsExported() {
		return ""
	}
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	switch name {
	case "-":
		return ""
	case "":
		return strings.ToLower(f.Name)
	}
	return name
}
