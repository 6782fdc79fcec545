package grpclimit_test

import (
	"fmt"
	"time"

	"google.golang.org/grpc"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/grpclimit"
)

func Example() {
	lim, err := engine.New(engine.Policy{Name: "free", Limit: 100, Window: time.Minute})
	if err != nil {
		panic(err)
	}
	defer lim.Close()
	gl, err := grpclimit.New(grpclimit.WithBackend(lim),
		grpclimit.WithKeyFunc(grpclimit.MetadataKey("x-api-key")))
	if err != nil {
		panic(err)
	}
	srv := grpc.NewServer(
		grpc.UnaryInterceptor(gl.UnaryServerInterceptor()),
		grpc.StreamInterceptor(gl.StreamServerInterceptor()),
		grpc.MaxHeaderListSize(64<<10), // bound the metadata clients may send
	)
	defer srv.Stop()
	fmt.Println("register services on srv, then srv.Serve(listener)")
	// Output: register services on srv, then srv.Serve(listener)
}
