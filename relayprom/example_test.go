package relayprom_test

import (
	"log"
	"net/http"
	"os"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/relayprom"
)

// The collector labels metrics with the upstreams and models it is given,
// and up to 32 more models it learns from calls (anything else is
// "other").
func Example() {
	upstreams := []relay.Upstream{
		{Name: "us-east", BaseURL: "https://us.example.com/v1", APIKey: os.Getenv("US_KEY")},
		{Name: "eu-west", BaseURL: "https://eu.example.com/v1", APIKey: os.Getenv("EU_KEY")},
	}
	// README:relayprom
	prom := relayprom.New(relayprom.WithUpstreams(upstreams...), relayprom.WithModels("gemini-2.5-flash", "deepseek-v3.2"))
	reg := prometheus.NewRegistry()
	reg.MustRegister(prom) // serve it: http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	router, err := relay.New(relay.Config{
		Upstreams: upstreams,
		Hooks:     prom.Hooks(), // with others: relay.JoinHooks(obs.Hooks(), prom.Hooks())
		OnReport:  func(r relay.Report) { log.Printf("%s via %s: $%.5f", r.Model, r.Upstream, r.CostUSD) },
	})
	if err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: router} // every call counted
	// README:end
	_ = client
	// Output:
}
