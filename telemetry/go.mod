module github.com/slidegate/slidegate/telemetry

go 1.26.0

// Sibling modules of this repository resolve to their folders here;
// go.work at the root does the same for development.
replace (
	github.com/slidegate/slidegate => ..
	github.com/slidegate/slidegate/cmd/slidegate => ../cmd/slidegate
	github.com/slidegate/slidegate/deploy => ../deploy
	github.com/slidegate/slidegate/grpclimit => ../grpclimit
	github.com/slidegate/slidegate/lab => ../lab
	github.com/slidegate/slidegate/redisstore => ../redisstore
	github.com/slidegate/slidegate/remote => ../remote
	github.com/slidegate/slidegate/internal/rls => ../internal/rls
	github.com/slidegate/slidegate/internal/server => ../internal/server
)

require (
	github.com/slidegate/slidegate v0.0.0-00010101000000-000000000000
	github.com/slidegate/slidegate/grpclimit v0.0.0-00010101000000-000000000000
	go.opentelemetry.io/otel v1.47.0
	go.opentelemetry.io/otel/exporters/otlp/otlptrace v1.47.0
	go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc v1.47.0
	go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp v1.47.0
	go.opentelemetry.io/otel/sdk v1.47.0
	go.opentelemetry.io/otel/trace v1.47.0
	go.opentelemetry.io/proto/otlp v1.11.0
	go.uber.org/goleak v1.3.0
	google.golang.org/grpc v1.85.0
	google.golang.org/protobuf v1.36.12
)

require (
	github.com/cenkalti/backoff/v5 v5.0.3 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/go-logr/logr v1.4.4 // indirect
	github.com/go-logr/stdr v1.2.2 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/grpc-ecosystem/grpc-gateway/v2 v2.30.0 // indirect
	github.com/puzpuzpuz/xsync/v3 v3.5.1 // indirect
	go.opentelemetry.io/auto/sdk v1.2.1 // indirect
	go.opentelemetry.io/otel/log v1.47.0 // indirect
	go.opentelemetry.io/otel/metric v1.47.0 // indirect
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	google.golang.org/genproto/googleapis/api v0.0.0-20260928230214-8a89bd6388cc // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20261123191846-1e707ab9fbc2 // indirect
)
