//! Exactly-once effects: the tau-bench recording reproduced call for call,
//! with every approval beyond the recording's an interrupted re-approval;
//! MCP and HTTP tools from the operator's catalogue, with a destructive MCP
//! tool that never runs twice across `kill -9`.

mod mcp_tools;
mod tau_batch;
