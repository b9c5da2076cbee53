//! glia's end-to-end suite. The tests are in `fleet/` (by guarantee) and
//! `chaos/`; the helpers they share are in `glia-testkit`. Catalogue:
//! `tests/README.md`.
