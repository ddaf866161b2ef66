import metricsync as ms
a = ms.Metrics(); a.record("x", -0.0)
b = ms.Metrics.from_bytes(ms.Metrics().to_bytes())   # a decoded empty Metrics
b.merge(a)
print(b.compute(), ms.Metrics().merge(a).compute())
