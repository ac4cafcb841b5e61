// Softmax exponent unit: e = 2**u in Q1.15 for score differences d <= 0, W lanes. Mirrors softmax_exp:
//   a = min(-round_half_up(d * M / 2**S), 31*256 + 255);  e = round_half_up(LUT[a & 255] / 2**(a >> 8))
// LUT: 256 x 16-bit Q1.15 (build/luts/exp2.hex from fixed_point.exp2_table). M (15 bits) and S are
// per-head constants (ports, held stable). Pipeline: multiply, round+negate+clamp, LUT read, shift (4).
module softmax_exp #(
    parameter W        = 8,
    parameter D_W      = 32,
    parameter LUT_FILE = "exp2.hex"
) (
    input  wire             clk,
    input  wire             rst,
    input  wire             in_valid,
    input  wire [D_W*W-1:0] d,
    input  wire [14:0]      mult,
    input  wire [5:0]       shift,
    output reg              out_valid,
    output reg  [16*W-1:0]  e
);
    localparam PROD_W = D_W + 16;
    localparam A_MAX  = 31 * 256 + 255;


    reg                v1, v2, v3;
    reg [PROD_W*W-1:0] prod1;
    reg [13*W-1:0]     a2;
    reg [16*W-1:0]     lut3;
    reg [5*W-1:0]      n3;

    wire [PROD_W:0]        one_sh = {{PROD_W{1'b0}}, 1'b1} << shift;
    wire signed [PROD_W:0] half   = $signed({1'b0, one_sh[PROD_W:1]});
    reg  signed [PROD_W:0] u;
    reg  [16:0]            r;
    integer i;

    always @(posedge clk) begin
        v1 <= in_valid; v2 <= v1; v3 <= v2; out_valid <= v3;
        for (i = 0; i < W; i = i + 1) begin
            prod1[PROD_W*i +: PROD_W] <= $signed(d[D_W*i +: D_W]) * $signed({1'b0, mult});
            u = ($signed({prod1[PROD_W*(i+1)-1], prod1[PROD_W*i +: PROD_W]}) + half) >>> shift;
            a2[13*i +: 13] <= (-u > A_MAX) ? A_MAX[12:0] : (-u);
            n3[5*i +: 5] <= a2[13*i + 8 +: 5];
            r = ({1'b0, lut3[16*i +: 16]} + (({16'd0, 1'b1} << n3[5*i +: 5]) >> 1)) >> n3[5*i +: 5];
            e[16*i +: 16] <= r[15:0];
        end
        if (rst) begin
            v1 <= 1'b0; v2 <= 1'b0; v3 <= 1'b0; out_valid <= 1'b0;
        end
    end

    // one single-read-port table per lane
    genvar g;
    generate
        for (g = 0; g < W; g = g + 1) begin : lane
            reg [15:0] rom [0:255];
            initial $readmemh(LUT_FILE, rom);
            always @(posedge clk) lut3[16*g +: 16] <= rom[a2[13*g +: 8]];
        end
    endgenerate
endmodule
