// Row pre-shift in front of RMSNorm: an int32 residual row of D values (W per beat) -> 16-bit values.
// Mirrors integer_model.rmsnorm_wide's first half: s = max(bitlen(max|x|) - 14, 0) per row (max|x|
// clamped to >= 1), y = round_half_up(x / 2**s), eps = round_half_up(eps0 / 4**s); |y| <= 2**14.
// The row is written into one bank of a 2-bank row buffer while its max |x| is found, then read back
// shifted from the cycle after its last beat; the next row fills the other bank meanwhile, so rows of
// exactly D/W contiguous beats may follow back to back (II = D/W). `side` (gamma) travels with x.
// Latency: 2 cycles from a row's last input beat to its first output beat.
module norm_prescale #(
    parameter D      = 16,
    parameter W      = 4,
    parameter SIDE_W = 16
) (
    input  wire                clk,
    input  wire                rst,
    input  wire                in_valid,
    input  wire                in_last,
    input  wire [32*W-1:0]     x,
    input  wire [SIDE_W*W-1:0] side,
    input  wire [31:0]         eps0,
    output reg                 out_valid,
    output reg                 out_last,
    output reg  [16*W-1:0]     y,
    output reg  [SIDE_W*W-1:0] side_out,
    output reg  [47:0]         eps
);
    localparam B  = D / W;
    localparam IW = (B > 1) ? $clog2(B) : 1;
    localparam BW = (32 + SIDE_W) * W;

    reg [BW-1:0] buffer [0:(2 << IW) - 1];
    reg          wbank, rbank, first, reading;
    reg [IW:0]   widx, ridx;
    reg [31:0]   top;               // running max |x| of the row being written
    reg [5:0]    sh_bank [0:1];
    reg [47:0]   eps_bank [0:1];

    // max |x| of this beat and of the row so far (|-2**31| = 2**31 fits 32 unsigned bits)
    reg [31:0] beat_max, row_max, mag;
    reg [5:0]  bl, sh_c;
    integer i;
    always @(*) begin
        beat_max = 0;
        for (i = 0; i < W; i = i + 1) begin
            mag = x[32*i + 31] ? -x[32*i +: 32] : x[32*i +: 32];
            if (mag > beat_max) beat_max = mag;
        end
        row_max = (first || beat_max > top) ? beat_max : top;
        if (row_max == 0) row_max = 1;
        bl = 0;
        for (i = 0; i < 32; i = i + 1)
            if (row_max[i]) bl = i + 1;
        sh_c = (bl > 14) ? bl - 14 : 0;
    end
    wire [6:0]  esh     = {sh_c, 1'b0};
    wire [32:0] e_half  = ({32'd0, 1'b1} << esh) >> 1;
    wire [32:0] eps_c   = ({1'b0, eps0} + e_half) >> esh;

    wire [BW-1:0] rword = buffer[{rbank, ridx[IW-1:0]}];
    wire [5:0]    rsh   = sh_bank[rbank];
    wire [32:0]   r_half = ({32'd0, 1'b1} << rsh) >> 1;
    reg signed [32:0] t;

    always @(posedge clk) begin
        if (in_valid) begin
            buffer[{wbank, widx[IW-1:0]}] <= {side, x};
            top <= row_max;
            first <= in_last;
            widx <= in_last ? 0 : widx + 1;
            if (in_last) begin
                sh_bank[wbank] <= sh_c; eps_bank[wbank] <= {15'd0, eps_c};
                wbank <= ~wbank; rbank <= wbank; ridx <= 0; reading <= 1'b1;
            end
        end
        out_valid <= reading; out_last <= reading && ridx == B - 1;
        if (reading) begin
            for (i = 0; i < W; i = i + 1) begin
                t = ($signed({rword[32*i + 31], rword[32*i +: 32]}) + $signed(r_half)) >>> rsh;
                y[16*i +: 16] <= t[15:0];
            end
            side_out <= rword[32*W +: SIDE_W*W];
            eps <= eps_bank[rbank];
            if (!(in_valid && in_last)) begin
                ridx <= ridx + 1;
                if (ridx == B - 1) reading <= 1'b0;
            end
        end
        if (rst) begin
            wbank <= 1'b0; widx <= 0; first <= 1'b1; reading <= 1'b0; out_valid <= 1'b0;
        end
    end
endmodule
