// RMSNorm of the int32 residual: norm_prescale (per-row shift into 15 bits) -> rmsnorm (IN_W = 16).
// Mirrors integer_model.rmsnorm_wide bit for bit; with int8 inputs (Qwen3's per-head q/k norm) the
// shift is 0 and it is fixed_point.rmsnorm itself. gamma (int16) streams beside x through the row
// buffer. The eps term is registered once more so it meets rmsnorm's sum stage with its own row.
// Latency: D/W + 15 cycles from a row's last input beat to its first output beat (the row is buffered
// once: its last beat leaves the prescale D/W + 1 cycles later, then rmsnorm's 14); II = D/W.
module rmsnorm_wide #(
    parameter D         = 16,
    parameter W         = 4,
    parameter SEED_FILE = "rsqrt_seed.hex"
) (
    input  wire            clk,
    input  wire            rst,
    input  wire            in_valid,
    input  wire            in_last,
    input  wire [32*W-1:0] x,
    input  wire [16*W-1:0] gamma,
    input  wire [14:0]     mult,
    input  wire [5:0]      shift,
    input  wire [31:0]     eps0,
    output wire            out_valid,
    output wire            out_last,
    output wire [8*W-1:0]  y
);
    wire            pv, pl;
    wire [16*W-1:0] px, pg;
    wire [47:0]     pe;
    reg  [47:0]     pe1;
    always @(posedge clk) pe1 <= pe;

    norm_prescale #(.D(D), .W(W), .SIDE_W(16)) pre (
        .clk(clk), .rst(rst), .in_valid(in_valid), .in_last(in_last), .x(x), .side(gamma), .eps0(eps0),
        .out_valid(pv), .out_last(pl), .y(px), .side_out(pg), .eps(pe));
    rmsnorm #(.D(D), .W(W), .IN_W(16), .SEED_FILE(SEED_FILE)) norm (
        .clk(clk), .rst(rst), .in_valid(pv), .in_last(pl), .x(px), .gamma(pg), .mult(mult), .shift(shift),
        .eps_term(pe1), .out_valid(out_valid), .out_last(out_last), .y(y));
endmodule
