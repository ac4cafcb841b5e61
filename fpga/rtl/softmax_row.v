// One attention row's softmax: scores (W per beat) minus the row max, masked, exp, normalised.
// Mirrors fixed_point.softmax_q15(scores, M, S, keep): d = s - max (max over kept scores, from
// argmax_stream's out_value on a first pass), e = softmax_exp(d) for kept lanes and 0 for masked ones,
// p = softmax_normalize(e). A row is exactly L/W contiguous beats (pad with keep = 0); scores must fit
// D_W - 1 bits so that d cannot overflow (q.k of int8 vectors: |s| < 2**22).
// Pipeline: subtract (1) -> softmax_exp (4) -> mask -> softmax_norm (11 after the row's last beat).
module softmax_row #(
    parameter L         = 32,
    parameter W         = 8,
    parameter D_W       = 32,
    parameter EXP_FILE  = "exp2.hex",
    parameter SEED_FILE = "recip_seed.hex"
) (
    input  wire             clk,
    input  wire             rst,
    input  wire             in_valid,
    input  wire             in_last,
    input  wire [D_W*W-1:0] s,
    input  wire [W-1:0]     keep,
    input  wire [D_W-1:0]   smax,
    input  wire [14:0]      mult,
    input  wire [5:0]       shift,
    output wire             out_valid,
    output wire             out_last,
    output wire [16*W-1:0]  p
);
    reg             v0, last0;
    reg [W-1:0]     keep0;
    reg [D_W*W-1:0] d0;
    reg [4:1]       lastd;
    reg [W-1:0]     keepd [1:4];
    integer i;
    always @(posedge clk) begin
        v0 <= in_valid; last0 <= in_last; keep0 <= keep;
        for (i = 0; i < W; i = i + 1)
            d0[D_W*i +: D_W] <= $signed(s[D_W*i +: D_W]) - $signed(smax);
        lastd <= {lastd[3:1], last0};
        keepd[1] <= keep0; keepd[2] <= keepd[1]; keepd[3] <= keepd[2]; keepd[4] <= keepd[3];
        if (rst) v0 <= 1'b0;
    end

    wire            ev;
    wire [16*W-1:0] e;
    reg  [16*W-1:0] em;
    always @(*)
        for (i = 0; i < W; i = i + 1)
            em[16*i +: 16] = keepd[4][i] ? e[16*i +: 16] : 16'd0;

    softmax_exp #(.W(W), .D_W(D_W), .LUT_FILE(EXP_FILE)) ex (
        .clk(clk), .rst(rst), .in_valid(v0), .d(d0), .mult(mult), .shift(shift), .out_valid(ev), .e(e));
    softmax_norm #(.L(L), .W(W), .SEED_FILE(SEED_FILE)) nm (
        .clk(clk), .rst(rst), .in_valid(ev), .in_last(lastd[4]), .e(em), .out_valid(out_valid),
        .out_last(out_last), .p(p));
endmodule
