package relayotel_test

import (
	"log"
	"net/http"
	"os"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/relayotel"
)

// The observer reports to the global MeterProvider and TracerProvider (set
// them up as usual, e.g. with the OTLP exporters); it runs beside OnReport.
func Example() {
	upstreams := []relay.Upstream{
		{Name: "us-east", BaseURL: "https://us.example.com/v1", APIKey: os.Getenv("US_KEY")},
		{Name: "eu-west", BaseURL: "https://eu.example.com/v1", APIKey: os.Getenv("EU_KEY")},
	}
	// README:relayotel
	obs := relayotel.New(relayotel.WithUpstreams(upstreams...))
	router, err := relay.New(relay.Config{
		Upstreams: upstreams,
		Hooks:     obs.Hooks(), // with others: relay.JoinHooks(obs.Hooks(), prom.Hooks())
		OnReport:  func(r relay.Report) { log.Printf("%s via %s: $%.5f", r.Model, r.Upstream, r.CostUSD) },
	})
	if err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: router} // spans and metrics for every call
	// README:end
	_ = client
	// Output:
}
