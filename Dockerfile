# Multi-stage build of the `glia` binary (dispatcher, worker, CLI in one).
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p glia-cli && strip target/release/glia

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 glia
COPY --from=build /src/target/release/glia /usr/local/bin/glia
COPY examples /usr/share/glia/examples
USER glia
ENTRYPOINT ["glia"]
