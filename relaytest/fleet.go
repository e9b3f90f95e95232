package relaytest

// Fleet is a set of named Servers standing for several upstreams. Each
// Server is started with WithName(its name), so every answer says which one
// gave it. A Fleet is safe for concurrent use by multiple goroutines.
type Fleet struct {
	// Servers are the fleet's servers, in the order of the names given to
	// NewFleet.
	Servers []*Server
	byName  map[string]*Server
}

// NewFleet starts one Server per name, each with opts followed by
// WithName(name). Names must be unique. Call Close when done.
func NewFleet(names []string, opts ...Option) *Fleet {
	f := &Fleet{byName: make(map[string]*Server, len(names))}
	for _, name := range names {
		if _, dup := f.byName[name]; dup {
			f.Close()
			panic("relaytest: duplicate fleet name " + name)
		}
		s := NewServer(append(opts[:len(opts):len(opts)], WithName(name))...)
		f.Servers = append(f.Servers, s)
		f.byName[name] = s
	}
	return f
}

// Get returns the server named name, or nil.
func (f *Fleet) Get(name string) *Server { return f.byName[name] }

// Calls returns the number of calls each server received, by name.
func (f *Fleet) Calls() map[string]int {
	out := make(map[string]int, len(f.Servers))
	for name, s := range f.byName {
		out[name] = s.Calls()
	}
	return out
}

// Close closes every server.
func (f *Fleet) Close() {
	for _, s := range f.Servers {
		s.Close()
	}
}
