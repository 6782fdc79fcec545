package envoy

import (
	"context"
	"net"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/anypb"
)

// The peer's two xDS tests (TestXdsProviderBasicConfig,
// TestXdsProviderBasicConfigReload): the peer takes its rules from an
// xDS management server (CONFIG_TYPE=GRPC_XDS_SOTW) instead of the
// runtime directory. The peer's test serves them with go-control-plane's
// snapshot cache over ADS; here a small state-of-the-world ADS server
// on loopback serves the same RateLimitConfig resources. slidegate has
// no xDS: it refuses CONFIG_TYPE=GRPC_XDS_SOTW at start with exit 2,
// naming the variable (docs/envoy.md, "A feature slidegate does not
// have stops the start").

// rlsConfigType is the type URL of ratelimit.config.ratelimit.v3's
// RateLimitConfig, the resource the peer asks for.
const rlsConfigType = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// xdsRule is one descriptor of a RateLimitConfig: key, unit (the
// RateLimitUnit enum: 1 second, 2 minute, 3 hour, 4 day) and limit.
type xdsRule struct {
	key  string
	unit uint64
	rpu  uint64
}

// xdsConfig is a RateLimitConfig whose descriptors are one key each.
type xdsConfig struct {
	domain string
	rules  []xdsRule
}

// encode writes the RateLimitConfig in protobuf's wire format (name 1,
// domain 2, descriptors 3; a descriptor's key 1 and rate_limit 3; a
// policy's unit 1 and requests_per_unit 2).
func (x xdsConfig) encode() []byte {
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, x.domain)
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendString(b, x.domain)
	for _, r := range x.rules {
		var pol []byte
		pol = protowire.AppendTag(pol, 1, protowire.VarintType)
		pol = protowire.AppendVarint(pol, r.unit)
		if r.rpu != 0 {
			pol = protowire.AppendTag(pol, 2, protowire.VarintType)
			pol = protowire.AppendVarint(pol, r.rpu)
		}
		var d []byte
		d = protowire.AppendTag(d, 1, protowire.BytesType)
		d = protowire.AppendString(d, r.key)
		d = protowire.AppendTag(d, 3, protowire.BytesType)
		d = protowire.AppendBytes(d, pol)
		b = protowire.AppendTag(b, 3, protowire.BytesType)
		b = protowire.AppendBytes(b, d)
	}
	return b
}

// The peer test's initialXdsBasicConfig, and the reload domain its
// reload test adds.
var (
	xdsInitial = []xdsConfig{
		{"basic", []xdsRule{{"key1", 1, 50}, {"key1_local", 1, 50}, {"one_per_minute", 2, 1}}},
		{"another", []xdsRule{{"key2", 2, 20}, {"key3", 3, 10}, {"key2_local", 2, 20}, {"key3_local", 3, 10}, {"key4", 4, 20}, {"key4_local", 4, 20}}},
	}
	xdsReload = xdsConfig{"reload", []xdsRule{{"key1", 1, 50}, {"block", 1, 0}, {"one_per_minute", 2, 1}}}
)

// adsServer serves one snapshot of RateLimitConfig resources to every
// node, over ADS, state of the world: the snapshot when a stream asks,
// and each new one after the client acknowledged the last.
type adsServer struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	addr    string
	mu      sync.Mutex
	version int
	configs []xdsConfig
	changed chan struct{} // closed when the snapshot changes
}

func startADS(t *testing.T, configs []xdsConfig) *adsServer {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &adsServer{addr: l.Addr().String(), version: 1, configs: configs, changed: make(chan struct{})}
	gs := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, s)
	done := make(chan struct{})
	go func() { defer close(done); _ = gs.Serve(l) }()
	t.Cleanup(func() { gs.Stop(); <-done })
	return s
}

// set replaces the snapshot with a new version.
func (s *adsServer) set(configs []xdsConfig) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.version++
	s.configs = configs
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *adsServer) snapshot() (string, []xdsConfig, chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strconv.Itoa(s.version), s.configs, s.changed
}

func (s *adsServer) StreamAggregatedResources(stream discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	sent := ""
	for {
		r, err := stream.Recv()
		if err != nil {
			return nil
		}
		if r.TypeUrl != rlsConfigType {
			return status.Errorf(codes.InvalidArgument, "type %q: this server serves %s only", r.TypeUrl, rlsConfigType)
		}
		version, configs, changed := s.snapshot()
		if sent != "" && r.ResponseNonce == sent {
			// The answer to what was sent (an ACK or a NACK): the next
			// response is the next snapshot.
			select {
			case <-changed:
			case <-stream.Context().Done():
				return nil
			}
			version, configs, _ = s.snapshot()
		}
		resp := &discoveryv3.DiscoveryResponse{VersionInfo: version, TypeUrl: rlsConfigType, Nonce: version}
		for _, c := range configs {
			resp.Resources = append(resp.Resources, &anypb.Any{TypeUrl: rlsConfigType, Value: c.encode()})
		}
		if err := stream.Send(resp); err != nil {
			return nil
		}
		sent = version
	}
}

// xdsUp waits until the service answers a request of a domain without
// rules with OK, which the peer does once its first configuration
// arrived (before, its answer is an error): true, or false when it
// exited first (90 s at most).
func xdsUp(c *chk) bool {
	deadline := time.Now().Add(90 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := c.p.rl.ShouldRateLimit(ctx, req("foo", []string{"hello", "world"}))
		cancel()
		if err == nil {
			return true
		}
		select {
		case <-c.p.exited:
			return false
		default:
		}
		if time.Now().After(deadline) {
			c.errorf("no configuration from the xDS server within 90 s: %v", err)
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// xdsCases are the two tests' variants, on a Redis server of their own
// (also the per-second one) so that they run beside the other groups.
func xdsCases(t *testing.T) []suiteCase {
	ads := startADS(t, xdsInitial)
	rs := startRedis(t)
	vars := func(perSecond bool, localCache int) map[string]string {
		m := map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": rs.addr, "REDIS_TIMEOUT": "10s",
			"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_NODE_ID": "init-test-node", "CONFIG_GRPC_XDS_SERVER_URL": ads.addr}
		if perSecond {
			m["REDIS_PERSECOND"] = "true"
			m["REDIS_PERSECOND_SOCKET_TYPE"] = "tcp"
			m["REDIS_PERSECOND_URL"] = rs.addr
		}
		if localCache > 0 {
			m["LOCAL_CACHE_SIZE_IN_BYTES"] = strconv.Itoa(localCache)
		}
		return m
	}
	flush := func(t *testing.T) {
		rdb := redis.NewClient(&redis.Options{Addr: rs.addr})
		defer rdb.Close()
		if err := rdb.FlushAll(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// CONFIG_TYPE is checked before the per-second Redis and the local
	// cache: the message names it in every variant.
	refused := func(c *chk, up bool) { c.exited(up, 2, regexp.MustCompile(`CONFIG_TYPE="GRPC_XDS_SOTW": `)) }
	variant := func(name string, perSecond bool, localCache int, check func(c *chk)) suiteCase {
		return suiteCase{name: name, env: vars(perSecond, localCache), group: "xds", before: flush, up: xdsUp, check: check,
			differs: []string{rowRefusedVar}, sgCheck: refused}
	}
	basic := func(local bool) func(c *chk) { return func(c *chk) { integBasic(c, local, false) } }
	return []suiteCase{
		variant("TestXdsProviderBasicConfig/WithoutPerSecondRedis", false, 0, basic(false)),
		variant("TestXdsProviderBasicConfig/WithPerSecondRedis", true, 0, basic(false)),
		variant("TestXdsProviderBasicConfig/WithoutPerSecondRedisWithLocalCache", false, 1000, basic(true)),
		variant("TestXdsProviderBasicConfig/WithPerSecondRedisWithLocalCache", true, 1000, basic(true)),
		// testConfigReload with the xDS server's snapshots 2 (the reload
		// domain added) and 3 (the initial rules again). The peer's test
		// waits for its load counter; here the probe is the reload
		// domain's block rule, limit 0.
		variant("TestXdsProviderBasicConfigReload/ReloadConfigWithXdsServer", false, 0, func(c *chk) {
			block := req("reload", []string{"block", "foo"})
			c.integ(block, codeOK, ist{code: codeOK, noLimit: true})
			probe := func() string {
				r := c.call(block)
				if r == nil {
					return "error"
				}
				return r.OverallCode.String()
			}
			ads.set(append(append([]xdsConfig{}, xdsInitial...), xdsReload))
			c.eventually("reload/block once the server sends the reload domain", "OVER_LIMIT", probe)
			c.integ(req("reload", []string{"key1", "foo"}), codeOK, ist{codeOK, 50, perSecond, 49, false})
			ads.set(xdsInitial)
			c.eventually("reload/block once the server sends the initial rules again", "OK", probe)
		}),
	}
}
