// Fixed delay of DELAY cycles (>= 2) for a WIDTH-bit word, as a circular buffer in one simple
// dual-port RAM (BRAM/LUTRAM after synthesis) instead of DELAY x WIDTH flip-flops.
// Every cycle writes din at wp and reads the word written DELAY-1 cycles ago into a register:
// dout(t) = din(t - DELAY). No reset (data only; callers delay their valid bits in flip-flops).
module delay_ram #(
    parameter WIDTH = 32,
    parameter DELAY = 16
) (
    input  wire             clk,
    input  wire [WIDTH-1:0] din,
    output reg  [WIDTH-1:0] dout
);
    localparam AW = $clog2(DELAY);
    reg [WIDTH-1:0] mem [0:(1 << AW) - 1];
    reg [AW-1:0]    wp = 0;
    wire [AW-1:0]   rp = wp - (DELAY - 1);
    always @(posedge clk) begin
        mem[wp] <= din;
        dout    <= mem[rp];
        wp      <= wp + 1'b1;
    end
endmodule
